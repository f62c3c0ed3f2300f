"""What ``smockron proxy`` forwards, and how: the request as parsed, the head it sends
upstream, the response head it sends back.

Pure: bytes in, bytes out. Hop-by-hop headers (RFC 9110 7.6.1: those listed here and
those a ``Connection`` header names) are dropped both ways; the request gets
``X-Forwarded-For`` (appended to), ``X-Forwarded-Host`` and ``X-Forwarded-Proto`` (kept
when the client sent them) and the upstream's ``Host``.
"""

from __future__ import annotations

import asyncio
import re
from http import HTTPStatus
from typing import TYPE_CHECKING, Final
from urllib.parse import unquote

import httptools

from smockron.gatekeeper.identify import RequestInfo

if TYPE_CHECKING:
    from smockron.gatekeeper._http1_upstream import Upstream

MAX_FIELD: Final = 8190
"""Longest header line (name and value), as aiohttp's and nginx's defaults."""
MAX_HEAD: Final = 64 * 1024
"""Longest request line plus headers."""

HOP_BY_HOP: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
    }
)
REQUEST_DROP: Final = HOP_BY_HOP | {b"host", b"expect", b"x-forwarded-for"}
"""Request headers not passed on as they came (the proxy writes its own)."""
FRAMING: Final = frozenset(
    {b"host", b"connection", b"transfer-encoding", b"content-length", b"expect"}
)
"""Request headers that say how the request is framed and where it goes."""
CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"

_REASONS: Final = {s.value: s.phrase.encode() for s in HTTPStatus}
_STATUS_LINES: Final = {
    code: b"HTTP/1.1 %d %s" % (code, phrase) for code, phrase in _REASONS.items()
}
_METHODS: Final = {
    m.encode(): m for m in ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")
}
_KEYS: dict[str, bytes] = {}  # header names asked for, encoded once
# over a lower-cased response head, whose lines llhttp has checked (CRLF, no folding, no
# space before a colon); the alternatives branch on their first letter (no re.IGNORECASE:
# twice as fast)
_RESPONSE_FRAMING: Final = re.compile(
    rb"\r\n(c(?:ontent-length|onnection)|keep-alive|proxy-(?:authenticate|authorization|"
    rb"connection)|t(?:e|railers?|ransfer-encoding)|upgrade):([^\r]*)"
)

# how a response body goes to the client
NONE, RAW, CHUNKED = 0, 1, 2


def tokens(value: bytes) -> set[bytes]:
    """A comma-separated header value's tokens, lower case."""
    return {t.strip().lower() for t in value.split(b",") if t.strip()}


class Request(RequestInfo):
    """One request on a client connection, from its head to the end of its response;
    also what identification reads (``peer``, ``method``, ``path``, :meth:`header`)."""

    __slots__ = (
        "chunked",
        "close_after",
        "complete",
        "dropped",
        "expect",
        "extra",
        "has_body",
        "head",
        "headers",
        "held",
        "host",
        "http11",
        "keep_alive",
        "mode",
        "pending",
        "responded",
        "task",
        "up",
        "url",
        "verb",
    )

    def __init__(self, peer: str | None) -> None:  # no super().__init__: set here
        self.peer = peer
        self.method = ""  # set with ``verb`` when the head is complete
        self.url = b""
        self.headers: list[tuple[bytes, bytes, bytes]] = []  # lower-case name, name, value
        self.verb = b""
        self.http11 = True
        self.keep_alive = True
        self.chunked = False
        self.has_body = False
        self.expect = False
        self.host: bytes | None = None
        self.dropped: set[bytes] | None = None  # header names Connection lists
        self.complete = False  # the whole request (body included) has been read
        self.pending: list[bytes] | None = None  # body held until an upstream is attached
        self.held = 0  # bytes of the head, then of the body held
        self.up: Upstream | None = None
        self.head = b""  # as sent upstream (kept for one retry on a stale connection)
        self.extra = b""  # header lines added to the response
        self.responded = False  # the response head is out
        self.mode = NONE
        self.close_after = False
        self.task: asyncio.Task[None] | None = None

    def set_verb(self, verb: bytes) -> None:
        self.verb = verb
        self.method = _METHODS.get(verb) or verb.decode("latin-1")

    def header(self, name: str) -> str | None:
        """A header by lower-case name, repeats joined with ``", "``."""
        key = _KEYS.get(name)
        if key is None:
            key = name.encode("latin-1")
            if len(_KEYS) < 256:
                _KEYS[name] = key
        found = None
        for lname, _, value in self.headers:
            if lname == key:
                found = value if found is None else found + b", " + value
        return None if found is None else found.decode("latin-1")

    @property
    def path(self) -> str:  # type: ignore[override]  # RequestInfo's is set at once
        """The path, percent-decoded, without the query (worked out when asked)."""
        url = self.url
        if not url.startswith(b"/"):
            try:
                url = httptools.parse_url(url).path or b"/"
            except httptools.HttpParserInvalidURLError:
                return ""
        path = url.split(b"?", 1)[0].decode("latin-1")
        return unquote(path, "utf-8", "surrogateescape") if "%" in path else path


def framing_header(req: Request, lname: bytes, value: bytes) -> None:
    """A request header of :data:`FRAMING`, noted."""
    if lname == b"host":
        req.host = value
    elif lname == b"connection":
        if value.lower() not in (b"keep-alive", b"close"):
            req.dropped = (req.dropped or set()) | tokens(value)
    elif lname == b"transfer-encoding":
        req.chunked = True
        req.has_body = True
    elif lname == b"content-length":
        req.has_body = value.strip() not in (b"0", b"")
    elif lname == b"expect":
        req.expect = value.strip().lower() == b"100-continue"


def request_head(req: Request, prefix: bytes, host: bytes, peer: bytes, local: bytes) -> bytes:
    """The head sent upstream: origin-form target under ``prefix``, ``Host: host``, the
    client's end-to-end headers, ``X-Forwarded-For`` ending with ``peer``,
    ``X-Forwarded-Host`` (the client's Host, else ``local``) and ``-Proto``."""
    url = req.url
    if not url.startswith(b"/") and url != b"*":  # absolute-form
        parsed = httptools.parse_url(url)
        url = (parsed.path or b"/") + (b"?" + parsed.query if parsed.query else b"")
    parts = [req.verb, b" ", prefix, url, b" HTTP/1.1\r\nHost: ", host]
    drop = REQUEST_DROP if req.dropped is None else REQUEST_DROP | req.dropped
    xff: list[bytes] = []
    xfh = xfp = False
    for lname, name, value in req.headers:
        if lname in drop:
            if lname == b"x-forwarded-for":
                xff.append(value)
            continue
        if lname == b"x-forwarded-host":
            xfh = True
        elif lname == b"x-forwarded-proto":
            xfp = True
        parts += (b"\r\n", name, b": ", value)
    xff.append(peer)
    parts += (b"\r\nX-Forwarded-For: ", b", ".join(xff) if len(xff) > 1 else peer)
    if not xfh:
        parts += (b"\r\nX-Forwarded-Host: ", req.host or local)
    if not xfp:
        parts.append(b"\r\nX-Forwarded-Proto: http")
    if req.chunked:
        parts.append(b"\r\nTransfer-Encoding: chunked")
    parts.append(b"\r\n\r\n")
    return b"".join(parts)


def response_fields(fields: bytes) -> tuple[bytes, bool, bool]:
    """An upstream response's header lines (each after a CRLF, as llhttp accepted them)
    without the hop-by-hop ones; whether it had Content-Length, Transfer-Encoding."""
    lower = fields.lower()  # ASCII only: the offsets are the same
    found = _RESPONSE_FRAMING.findall(lower)
    if not found:
        return fields, False, False
    length = chunked = False
    named: set[bytes] | None = None
    for name, value in found:
        if name == b"content-length":
            length = True
            continue
        if name == b"transfer-encoding":
            chunked = True
        elif name == b"connection" and value.strip() not in (b"keep-alive", b"close"):
            named = (named or set()) | tokens(value)
        start = lower.find(b"\r\n%s:" % name)  # the first such line: each goes in turn
        end = lower.find(b"\r\n", start + 2)
        end = len(lower) if end < 0 else end
        fields, lower = fields[:start] + fields[end:], lower[:start] + lower[end:]
    if named:  # Connection named more headers: drop those too (never the framing)
        named.discard(b"content-length")
        fields = b"".join(
            b"\r\n" + line
            for line in fields.split(b"\r\n")[1:]
            if line.partition(b":")[0].lower() not in named
        )
    return fields, length, chunked


def response_head(
    req: Request, status: int, fields: bytes, length: bool, chunked: bool, closing: bool
) -> bytes:
    """The upstream's response head as relayed (``fields``: its end-to-end header lines,
    each after a CRLF), and ``req.mode``: how its body goes to the client."""
    parts = [status_line(status), fields]
    if req.verb == b"HEAD" or status in (204, 304):
        req.mode = NONE
    elif length and not chunked:
        req.mode = RAW
    elif req.http11:
        req.mode = CHUNKED
        parts.append(b"\r\nTransfer-Encoding: chunked")
    else:  # an HTTP/1.0 client: the end of the body is the end of the connection
        req.mode = RAW
        req.close_after = True
    if not req.complete or not req.keep_alive or closing:
        req.close_after = True
    if req.close_after:
        parts.append(b"\r\nConnection: close")
    elif not req.http11:
        parts.append(b"\r\nConnection: keep-alive")
    parts += (b"\r\n", req.extra, b"\r\n")
    req.responded = True
    return b"".join(parts)


def own_response(req: Request, status: bytes, headers: bytes, body: bytes, closing: bool) -> bytes:
    """A response of the proxy's own (rejection, 502): ``headers`` are ``Name: value\\r\\n``
    lines, without Content-Length."""
    if not req.complete or not req.keep_alive or closing:
        req.close_after = True
    conn = (
        b"Connection: close\r\n"
        if req.close_after
        else (b"" if req.http11 else b"Connection: keep-alive\r\n")
    )
    req.responded = True
    return b"HTTP/1.1 %s\r\n%s%sContent-Length: %d\r\n\r\n%s" % (
        status,
        headers,
        conn,
        len(body),
        b"" if req.verb == b"HEAD" else body,
    )


def status_line(status: int) -> bytes:
    """The status line with the standard reason phrase (as nginx: the upstream's carries
    nothing a client may act on)."""
    line = _STATUS_LINES.get(status)
    if line is None:
        line = b"HTTP/1.1 %d %s" % (status, _REASONS.get(status, b"Unknown"))
    return line


def chunk(data: bytes) -> tuple[bytes, bytes, bytes]:
    """``data`` as one chunk of a chunked body."""
    return b"%x\r\n" % len(data), data, b"\r\n"


__all__ = [
    "CHUNKED",
    "CONTINUE",
    "FRAMING",
    "HOP_BY_HOP",
    "MAX_FIELD",
    "MAX_HEAD",
    "NONE",
    "RAW",
    "REQUEST_DROP",
    "Request",
    "chunk",
    "framing_header",
    "own_response",
    "request_head",
    "response_fields",
    "response_head",
    "status_line",
    "tokens",
]
