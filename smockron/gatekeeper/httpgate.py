"""What every HTTP gatekeeper shares: resolving a request, loginfo, the rejection response.

Pure apart from the :class:`RequestInfo` it reads: the ASGI, WSGI and proxy adapters
build the request view and turn a :class:`Rejection` into their server's response.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from smockron.errors import ConfigError
from smockron.gatekeeper.identify import (
    DomainOf,
    Identify,
    RequestInfo,
    as_identifier,
    domain_resolver,
    peer_address,
)
from smockron.ratelog import RateLimitedLog

log = logging.getLogger("smockron.gatekeeper")

LOGINFO_MAX: Final = 512
REASONS: Final = {503: "Service Unavailable", 429: "Too Many Requests"}

LogInfo = Callable[[RequestInfo], "bytes | None"]


def http_loginfo(req: RequestInfo) -> bytes:
    """The seed's example loginfo: User-Agent and Referer, capped in size."""
    text = f"ua={req.header('user-agent') or '-'} referer={req.header('referer') or '-'}"
    return text.encode("utf-8", "replace")[:LOGINFO_MAX]


def retry_after_s(wait_ms: int) -> int:
    """``Retry-After`` in whole seconds, rounded up, never 0 (0 would invite a retry storm)."""
    return max(1, math.ceil(wait_ms / 1000))


@dataclass(frozen=True, slots=True)
class Rejection:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def status_line(self) -> str:
        return f"{self.status} {REASONS.get(self.status, 'Rejected')}"


JSON_TYPES: Final = frozenset({"application/problem+json", "application/json"})


def wants_problem_json(accept: str | None) -> bool:
    """True when the client's Accept names JSON problem details (RFC 9457) with q > 0.

    ``q=0`` means "not acceptable"; an unparsable q counts as 0 (the header is the
    client's, so it is hostile input).
    """
    if not accept:
        return False
    for item in accept.lower().split(","):
        media, *params = item.split(";")
        if media.strip() not in JSON_TYPES:
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if q > 0:
            return True
    return False


def rejection(status: int, wait_ms: int, accept: str | None) -> Rejection:
    """The response for a rejected request: status, Retry-After and a short body."""
    retry = retry_after_s(wait_ms)
    title = REASONS.get(status, "Rejected")
    detail = f"rate limited: retry after {retry} s"
    if wants_problem_json(accept):
        body = json.dumps(
            {"type": "about:blank", "title": title, "status": status, "detail": detail}
        ).encode()
        ctype = "application/problem+json"
    else:
        body = f"{status} {title}: {detail}\n".encode()
        ctype = "text/plain; charset=utf-8"
    headers = [
        ("content-type", ctype),
        ("content-length", str(len(body))),
        ("retry-after", str(retry)),
        ("cache-control", "no-store"),
    ]
    return Rejection(status, headers, body)


class HttpGate:
    """Maps a request to (domain, identifier, loginfo), caching encoded domain names."""

    def __init__(
        self,
        domain: str | Mapping[str, str] | DomainOf,
        identify: Identify = peer_address,
        loginfo: LogInfo | None = http_loginfo,
        reject_status: int = 503,
    ) -> None:
        if reject_status not in REASONS:
            raise ConfigError(f"reject_status must be 503 or 429, got {reject_status}")
        self.domain_of, self.domains = domain_resolver(domain)
        self.identify = identify
        self.loginfo = loginfo
        self.reject_status = reject_status
        self._encoded: dict[str, bytes] = {}
        self.errors = 0  # requests let through because identification or deciding failed
        self._error_log = RateLimitedLog(log)

    def fail_open(self, exc: BaseException) -> None:
        """A bug or a bad callable must not fail the request: count, log, let it through."""
        self.errors += 1
        self._error_log.warning("gatekeeper error, letting the request through: %r", exc)

    def target(self, req: RequestInfo) -> tuple[bytes, bytes, bytes | None] | None:
        """:meth:`resolve`, failing open on any error."""
        try:
            return self.resolve(req)
        except Exception as exc:
            self.fail_open(exc)
            return None

    def resolve(self, req: RequestInfo) -> tuple[bytes, bytes, bytes | None] | None:
        """``(domain, identifier, loginfo)``, or None when the request is not limited."""
        name = self.domain_of(req)
        if name is None:
            return None
        domain = self._encoded.get(name)
        if domain is None:
            if "\0" in name or not name:
                return None  # unusable as a topic: fail open rather than fail the request
            domain = name.encode()
            if len(self._encoded) < 10_000:  # a callable's names could be unbounded
                self._encoded[name] = domain
        identifier = as_identifier(self.identify(req))
        if identifier is None:
            return None
        return domain, identifier, self.loginfo(req) if self.loginfo else None

    def reject(self, wait_ms: int, req: RequestInfo) -> Rejection:
        return rejection(self.reject_status, wait_ms, req.header("accept"))
