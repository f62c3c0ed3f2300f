"""WSGI middleware for Flask, Django or any WSGI app.

A delayed request sleeps in its worker thread before the app sees it, so size
``max_delayed`` below the server's thread count, or delays will starve the workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Unpack

from prometheus_client import REGISTRY, CollectorRegistry

from smockron.gatekeeper._base import GatekeeperOptions
from smockron.gatekeeper._decider import Verdict
from smockron.gatekeeper._threaded import Gatekeeper
from smockron.gatekeeper.httpgate import HttpGate, LogInfo, http_loginfo
from smockron.gatekeeper.identify import DomainOf, Identify, RequestInfo, peer_address
from smockron.observe.collect import register_summed
from smockron.observe.layouts import GATEKEEPER

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]


def request_info(environ: Environ) -> RequestInfo:
    """The identification view of a WSGI environ."""

    def lookup(name: str) -> str | None:
        key = name.upper().replace("-", "_")
        if key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            value = environ.get(key)
        else:
            value = environ.get("HTTP_" + key)
        return str(value) if value is not None else None

    return RequestInfo(
        environ.get("REMOTE_ADDR"),
        environ.get("REQUEST_METHOD", "GET"),
        environ.get("PATH_INFO", "/"),
        lookup,
    )


class SmockronWSGIMiddleware:
    """Rate-limit a WSGI app through a Smockron master.

    The keywords mean what they mean for the ASGI middleware (the gatekeeper's own,
    :class:`~smockron.gatekeeper.GatekeeperOptions`, with :class:`Gatekeeper`'s
    defaults)."""

    def __init__(
        self,
        app: WSGIApp,
        *,
        domain: str | Mapping[str, str] | DomainOf,
        accounting: str | None = None,
        control: str | None = None,
        gatekeeper: Gatekeeper | None = None,
        identify: Identify = peer_address,
        loginfo: LogInfo | None = http_loginfo,
        reject_status: int = 503,
        registry: CollectorRegistry | None = REGISTRY,
        **options: Unpack[GatekeeperOptions],
    ) -> None:
        self.app = app
        self.gate = HttpGate(domain, identify, loginfo, reject_status)
        self.gatekeeper = gatekeeper or Gatekeeper(
            accounting, control, self.gate.domains, **options
        )
        if registry is not None:
            register_summed(registry, GATEKEEPER, self)

    def stats(self) -> dict[str, int]:
        """The gatekeeper's counters plus requests let through on errors."""
        return {**self.gatekeeper.stats(), "fail_open_errors": self.gate.errors}

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        req = request_info(environ)
        target = self.gate.target(req)
        if target is None:
            return self.app(environ, start_response)
        try:
            decision = self.gatekeeper.admit(*target)
        except Exception as exc:  # fail-permissive, even against our own bugs
            self.gate.fail_open(exc)
            return self.app(environ, start_response)
        if decision.verdict is not Verdict.REJECT:
            return self.app(environ, start_response)
        rejection = self.gate.reject(decision.wait_ms, req)
        start_response(rejection.status_line, rejection.headers)
        return [rejection.body]

    def close(self) -> None:
        self.gatekeeper.close()
