"""HTTP/1.1 proxying for ``smockron proxy``: asyncio protocols (uvloop's transports when
it runs the loop) with httptools (llhttp) parsing the clients' requests and the
upstream's responses.

A request is handled in the parser's callbacks: no task unless it waits out a delay or
needs a new upstream connection. Bodies are streamed both ways with flow control (a full
write buffer on one side pauses reading on the other); bytes produced while one chunk of
input is parsed go out in one write. Upstream connections are kept alive in a pool.

Client bytes are hostile: a head over ``MAX_HEAD`` or a header line over ``MAX_FIELD``
is ``431``, anything llhttp refuses (bad method, bad ``Content-Length``, bad chunk
sizes, ``Content-Length`` with ``Transfer-Encoding``) is ``400``; the connection is then
closed, and the caller's ``bad_request`` is told.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import deque
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, Final
from urllib.parse import unquote, urlsplit

import httptools

from smockron.httpguard import _REFUSAL, ConnectionGuard
from smockron.ratelog import RateLimitedLog

MAX_FIELD: Final = 8190
"""Longest header line (name and value), as aiohttp's and nginx's defaults."""
MAX_HEAD: Final = 64 * 1024
"""Longest request line plus headers."""
HIGH_WATER: Final = 256 * 1024
"""Request body bytes held before reading from the client pauses (no upstream yet)."""
POOL_IDLE_S: Final = 30.0
"""An idle upstream connection is closed after this long."""
POOL_MAX_IDLE: Final = 1024
CONNECT_TIMEOUT_S: Final = 5.0

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
_REQUEST_DROP: Final = HOP_BY_HOP | {b"host", b"expect", b"x-forwarded-for"}
_FRAMING: Final = frozenset(
    {b"host", b"connection", b"transfer-encoding", b"content-length", b"expect"}
)
_REASONS: Final = {s.value: s.phrase.encode() for s in HTTPStatus}
_STATUS_LINES: Final = {
    code: b"HTTP/1.1 %d %s" % (code, phrase) for code, phrase in _REASONS.items()
}
_RESPONSE_FRAMING: Final = HOP_BY_HOP | {b"content-length"}
_CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"

# flags for why reading from a client is paused
_BODY, _PIPELINE, _UPSTREAM = 1, 2, 4
# how a response body goes to the client
_NONE, _RAW, _CHUNKED = 0, 1, 2

Header = tuple[bytes, bytes, bytes]  # lower-case name, name, value


class _TooLarge(Exception):
    pass


def _tokens(value: bytes) -> set[bytes]:
    return {t.strip().lower() for t in value.split(b",") if t.strip()}


class Request:
    """One request on a client connection, from its head to the end of its response."""

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
        "method",
        "mode",
        "pending",
        "responded",
        "task",
        "up",
        "url",
    )

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[Header] = []
        self.method = b""
        self.http11 = True
        self.keep_alive = True
        self.chunked = False
        self.has_body = False
        self.expect = False
        self.host: bytes | None = None
        self.dropped: set[bytes] | None = None  # header names Connection lists
        self.complete = False  # the whole request (body included) has been read
        self.pending: list[bytes] | None = None  # body held until an upstream is attached
        self.held = 0
        self.up: _Upstream | None = None
        self.head = b""  # as sent upstream (kept for one retry on a stale connection)
        self.extra = b""  # header lines added to the response
        self.responded = False  # the response head is out
        self.mode = _NONE
        self.close_after = False
        self.task: asyncio.Task[None] | None = None

    def header(self, name: str) -> str | None:
        """A header by lower-case name, repeats joined with ``", "`` (RequestInfo's lookup)."""
        key = name.encode("latin-1")
        values = [v for k, _, v in self.headers if k == key]
        if not values:
            return None
        return b", ".join(values).decode("latin-1")

    @property
    def path(self) -> str:
        """The path, percent-decoded, without the query."""
        url = self.url
        if not url.startswith(b"/"):
            try:
                url = httptools.parse_url(url).path or b"/"
            except httptools.HttpParserInvalidURLError:
                return ""
        path = url.split(b"?", 1)[0].decode("latin-1")
        return unquote(path, "utf-8", "surrogateescape") if "%" in path else path


Handler = Callable[["ClientConnection", Request], None]


class Http1Proxy:
    """The listener, its connections and the upstream pool.

    ``handler(conn, req)`` is called when a request's head is complete; it must end in
    ``conn.forward(req, extra)`` or ``conn.respond(...)``, now or later. Made on the
    running loop."""

    def __init__(
        self,
        upstream: str,
        handler: Handler,
        guard: ConnectionGuard,
        log: logging.Logger,
        *,
        upstream_timeout_s: float = 60.0,
        bad_request: Callable[[str], None] | None = None,
    ) -> None:
        parts = urlsplit(upstream)
        self.handler = handler
        self.guard = guard
        self.log = log
        self.rlog = RateLimitedLog(log)
        self.bad_request = bad_request
        self.prefix = parts.path.rstrip("/").encode()
        self.host_header = parts.netloc.encode("idna" if not parts.netloc.isascii() else "ascii")
        self.pool = Pool(parts, upstream_timeout_s, self)
        self.conns: set[ClientConnection] = set()
        self.server: asyncio.AbstractServer | None = None
        self.closing = False
        self.local_host = b""
        self._sweep_s = 1.0
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self.local_host = f"{host}:{port}".encode()
        self.server = await loop.create_server(
            lambda: ClientConnection(self), host, port, reuse_address=True
        )
        self.pool.start()
        self._sweep_s = min(1.0, self.guard.header_timeout_s / 4)
        self._sweeper = loop.call_later(self._sweep_s, self._sweep)

    def _sweep(self) -> None:
        """Close connections past their header deadline (one timer for all of them,
        rather than one set and cancelled per request)."""
        now = self.pool.loop.time()
        guard = self.guard
        for conn in [c for c in guard._idle if c.deadline <= now]:  # type: ignore[attr-defined]
            guard._timed_out(conn)  # type: ignore[arg-type]
        self._sweeper = self.pool.loop.call_later(self._sweep_s, self._sweep)

    async def close(self, grace_s: float = 5.0) -> None:
        """Stop listening, let requests in progress finish (``grace_s`` at most), close.
        Well inside the runtime's 10 s for a stop, which also closes the gatekeeper."""
        self.closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self.server is not None:
            self.server.close()
        for conn in list(self.conns):
            if conn.active is None:
                conn.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while self.conns and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.conns):
            conn.abort()
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 1.0)
            self.server = None
        self.pool.close()

    def upstream_failed(self, exc: object, key: str = "upstream") -> None:
        self.rlog.warning("upstream %s failed: %r", self.pool.name, exc, key=key)


class ClientConnection(asyncio.Protocol):
    """One client connection: parses its requests, answers them in order."""

    def __init__(self, proxy: Http1Proxy) -> None:
        self.proxy = proxy
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.peer: str | None = None
        # for the ConnectionGuard: requests in progress, when the idle one is cut
        self.busy = 0
        self.deadline = 0.0
        self.timeout_s = proxy.guard.header_timeout_s
        self.req: Request | None = None  # being parsed
        self.active: Request | None = None  # being answered
        self.queue: deque[Request] = deque()  # pipelined, waiting their turn
        self.head_bytes = 0
        self.blocked = 0  # _BODY | _PIPELINE | _UPSTREAM: why reading is paused
        self.write_paused = False
        self.out: list[bytes] = []  # response bytes to write after the current input
        self.feeding = False
        self.closed = False
        self.too_large = False

    # ---- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        guard = self.proxy.guard
        if not guard._admit(self, transport):  # type: ignore[arg-type]
            self.closed = True
            with contextlib.suppress(Exception):
                transport.write(_REFUSAL)  # type: ignore[attr-defined]
            transport.close()
            return
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if isinstance(peer, tuple) and peer else None
        self.proxy.conns.add(self)
        self.deadline = self.proxy.pool.loop.time() + self.timeout_s
        guard._idle[self] = None  # type: ignore[index]

    def data_received(self, data: bytes) -> None:
        req = self.req
        if req is None or not req.method:
            self.head_bytes += len(data)
        self.feeding = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # Upgrade is hop-by-hop and not tunnelled: answer this request, then close
            if self.req is not None:
                self.req.close_after = True
        except httptools.HttpParserError as exc:
            self.feeding = False
            self._bad(exc)
            return
        finally:
            self.feeding = False
        req = self.req
        if (req is None or not req.method) and self.head_bytes > MAX_HEAD:
            self.too_large = True
            self._bad(_TooLarge(f"request head over {MAX_HEAD} bytes"))
            return
        active = self.active
        if active is not None:
            up = active.up
            if up is not None and up.out:
                up.flush()
        if self.out:
            self.flush()

    def eof_received(self) -> bool | None:
        if self.active is None and not self.queue:
            return False  # close
        # half-closed: answer what was asked, then close
        if self.req is not None and not self.req.complete and self.req.method:
            return False
        for r in (self.active, *self.queue):
            if r is not None:
                r.close_after = True
        return True

    def pause_writing(self) -> None:
        self.write_paused = True
        active = self.active
        if active is not None and active.up is not None and active.up.transport is not None:
            active.up.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        active = self.active
        if active is not None and active.up is not None and active.up.transport is not None:
            active.up.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.proxy.conns.discard(self)
        self.proxy.guard._gone(self)  # type: ignore[arg-type]
        for req in (self.active, *self.queue):
            if req is None:
                continue
            if req.task is not None:
                req.task.cancel()
            up = req.up
            if up is not None:  # mid-exchange: the upstream connection cannot be reused
                up.abandon()
        self.active = None
        self.queue.clear()

    # ---- httptools callbacks

    def on_message_begin(self) -> None:
        self.req = Request()

    def on_url(self, url: bytes) -> None:
        req = self.req
        assert req is not None
        req.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value)
        if size > MAX_FIELD:
            self.too_large = True
            raise _TooLarge(f"header line over {MAX_FIELD} bytes")
        req = self.req
        assert req is not None
        req.held += size + 4
        if req.held > MAX_HEAD:
            self.too_large = True
            raise _TooLarge(f"request head over {MAX_HEAD} bytes")
        lname = name.lower()
        req.headers.append((lname, name, value))
        if lname in _FRAMING:
            self._framing(req, lname, value)

    def _framing(self, req: Request, lname: bytes, value: bytes) -> None:
        """The headers that say how the request is framed and where it goes."""
        if lname == b"host":
            req.host = value
        elif lname == b"connection":
            if value.lower() not in (b"keep-alive", b"close"):
                req.dropped = (req.dropped or set()) | _tokens(value)
        elif lname == b"transfer-encoding":
            req.chunked = True
            req.has_body = True
        elif lname == b"content-length":
            req.has_body = value.strip() not in (b"0", b"")
        elif lname == b"expect":
            req.expect = value.strip().lower() == b"100-continue"

    def on_headers_complete(self) -> None:
        req = self.req
        assert req is not None
        parser = self.parser
        req.method = parser.get_method()
        req.keep_alive = parser.should_keep_alive()
        req.http11 = parser.get_http_version() == "1.1"
        req.held = 0  # counted the head's bytes, now counts the body's held ones
        self.head_bytes = 0
        if not self.busy:
            self.proxy.guard._idle.pop(self, None)  # type: ignore[call-overload]
        self.busy += 1
        if self.proxy.closing:
            req.close_after = True
        if self.active is None:
            self.active = req
            self._dispatch(req)
        else:
            self.queue.append(req)
            self._block(_PIPELINE)

    def on_body(self, data: bytes) -> None:
        req = self.req
        if req is None or (req.responded and req.up is None):
            return  # answered without the upstream: the body is dropped
        up = req.up
        if up is not None:
            if req.chunked:
                up.out.extend((b"%x\r\n" % len(data), data, b"\r\n"))
            else:
                up.out.append(data)
            return
        if req.pending is None:
            req.pending = []
        req.pending.append(data)
        req.held += len(data)
        if req.held > HIGH_WATER:
            self._block(_BODY)

    def on_message_complete(self) -> None:
        req = self.req
        assert req is not None
        req.complete = True
        up = req.up
        if up is not None:
            if req.chunked:
                up.out.append(b"0\r\n\r\n")
            if up.done:  # the response ended before the body did
                up.exchange_over()

    # ---- answering

    def _dispatch(self, req: Request) -> None:
        try:
            self.proxy.handler(self, req)
        except Exception:  # a bug of ours: this request fails, the process keeps serving
            self.proxy.log.exception("proxy handler failed")
            if not req.responded:
                self.respond(req, b"500 Internal Server Error", b"", b"500 Internal Server Error\n")

    def forward(self, req: Request, extra: bytes) -> None:
        """Send ``req`` upstream; ``extra`` header lines go into its response."""
        if self.closed or req is not self.active:
            return
        req.extra = extra
        req.head = self._request_head(req)
        up = self.proxy.pool.acquire()
        if up is None:
            req.task = asyncio.get_running_loop().create_task(self._connect(req))
        else:
            self._attach(req, up)

    async def _connect(self, req: Request) -> None:
        try:
            up = await self.proxy.pool.connect()
        except (OSError, TimeoutError) as exc:
            req.task = None
            self.proxy.upstream_failed(exc)
            self.bad_gateway(req)
            return
        req.task = None
        if self.closed or req is not self.active:
            self.proxy.pool.release(up)
            return
        self._attach(req, up)

    def _attach(self, req: Request, up: _Upstream) -> None:
        req.up = up
        up.begin(self, req)
        if req.expect and not req.complete and self.transport is not None:
            self.transport.write(_CONTINUE)
        out = up.out
        out.append(req.head)
        pending = req.pending
        if pending:
            if req.chunked:
                for data in pending:
                    out.extend((b"%x\r\n" % len(data), data, b"\r\n"))
            else:
                out.extend(pending)
            req.pending = None
            req.held = 0
            self._unblock(_BODY)
        if req.complete and req.chunked:
            out.append(b"0\r\n\r\n")
        if self.write_paused and up.transport is not None:
            up.transport.pause_reading()
        if not self.feeding:
            up.flush()

    def _request_head(self, req: Request) -> bytes:
        url = req.url
        if not url.startswith(b"/") and url != b"*":  # absolute-form
            parsed = httptools.parse_url(url)
            url = (parsed.path or b"/") + (b"?" + parsed.query if parsed.query else b"")
        proxy = self.proxy
        parts = [req.method, b" ", proxy.prefix, url, b" HTTP/1.1\r\nHost: ", proxy.host_header]
        drop = _REQUEST_DROP if req.dropped is None else _REQUEST_DROP | req.dropped
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
        xff.append((self.peer or "unknown").encode())
        parts += (b"\r\nX-Forwarded-For: ", b", ".join(xff))
        if not xfh:
            parts += (b"\r\nX-Forwarded-Host: ", req.host or proxy.local_host)
        if not xfp:
            parts.append(b"\r\nX-Forwarded-Proto: http")
        if req.chunked:
            parts.append(b"\r\nTransfer-Encoding: chunked")
        parts.append(b"\r\n\r\n")
        return b"".join(parts)

    def response_head(self, req: Request, status: int, fields: bytes, length: bool,
                      chunked: bool) -> None:  # fmt: skip
        """The upstream's response head, relayed: ``fields`` are its end-to-end header
        lines, each after a CRLF. The reason phrase is the standard one (as nginx does:
        the upstream's carries nothing a client may act on)."""
        no_body = req.method == b"HEAD" or status in (204, 304)
        line = _STATUS_LINES.get(status)
        if line is None:
            line = b"HTTP/1.1 %d %s" % (status, _REASONS.get(status, b"Unknown"))
        parts = [line, fields]
        if no_body:
            req.mode = _NONE
        elif length and not chunked:
            req.mode = _RAW
        elif req.http11:
            req.mode = _CHUNKED
            parts.append(b"\r\nTransfer-Encoding: chunked")
        else:  # an HTTP/1.0 client: the end of the body is the end of the connection
            req.mode = _RAW
            req.close_after = True
        if not req.complete or not req.keep_alive or self.proxy.closing:
            req.close_after = True
        if req.close_after:
            parts.append(b"\r\nConnection: close")
        elif not req.http11:
            parts.append(b"\r\nConnection: keep-alive")
        parts += (b"\r\n", req.extra, b"\r\n")
        req.responded = True
        self.out.append(b"".join(parts))

    def response_body(self, req: Request, data: bytes) -> None:
        if req.mode == _CHUNKED:
            self.out.extend((b"%x\r\n" % len(data), data, b"\r\n"))
        elif req.mode == _RAW:
            self.out.append(data)

    def response_done(self, req: Request) -> None:
        if req.mode == _CHUNKED:
            self.out.append(b"0\r\n\r\n")
        self._finished(req)

    def respond(self, req: Request, status_line: bytes, headers: bytes, body: bytes,
                extra: bytes = b"") -> None:  # fmt: skip
        """A response of our own (rejection, 502): ``headers`` are ``Name: value\\r\\n``
        lines, without Content-Length."""
        if self.closed or req.responded:
            return
        if not req.complete or not req.keep_alive or self.proxy.closing:
            req.close_after = True
        conn = b"Connection: close\r\n" if req.close_after else (
            b"" if req.http11 else b"Connection: keep-alive\r\n")  # fmt: skip
        self.out.append(b"HTTP/1.1 %s\r\n%s%s%sContent-Length: %d\r\n\r\n%s" % (
            status_line, headers, extra, conn, len(body),
            b"" if req.method == b"HEAD" else body))  # fmt: skip
        req.responded = True
        req.pending = None
        self._unblock(_BODY)
        self._finished(req)

    def bad_gateway(self, req: Request) -> None:
        if req.responded:  # headers are gone: cut the connection, the truncation shows
            self.flush()
            self.close()
            return
        self.respond(req, b"502 Bad Gateway", b"Content-Type: text/plain; charset=utf-8\r\n",
                     b"502 Bad Gateway: upstream unavailable\n", req.extra)  # fmt: skip

    def _finished(self, req: Request) -> None:
        req.up = None
        self.active = None
        self.busy -= 1
        if req.close_after or self.closed:
            self.close()
            return
        if not self.busy:
            guard = self.proxy.guard
            self.timeout_s = guard.idle_timeout_s
            self.deadline = self.proxy.pool.loop.time() + guard.idle_timeout_s
            guard._idle[self] = None  # type: ignore[index]
        if self.queue:
            asyncio.get_running_loop().call_soon(self._next)
        if not self.feeding:
            self.flush()

    def _next(self) -> None:
        if self.closed or self.active is not None or not self.queue:
            return
        req = self.active = self.queue.popleft()
        if not self.queue:
            self._unblock(_PIPELINE)
        self._dispatch(req)
        self.flush()

    # ---- plumbing

    def flush(self) -> None:
        out = self.out
        if out and self.transport is not None:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
            out.clear()

    def close(self) -> None:
        self.flush()
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def unblock_upstream(self) -> None:
        self._unblock(_UPSTREAM)

    def _block(self, why: int) -> None:
        if not self.blocked and self.transport is not None:
            self.transport.pause_reading()
        self.blocked |= why

    def _unblock(self, why: int) -> None:
        if self.blocked & why:
            self.blocked &= ~why
            if not self.blocked and self.transport is not None and not self.closed:
                self.transport.resume_reading()

    def _bad(self, exc: BaseException) -> None:
        """Unparsable input: 400 (431 for an oversized head), count, close."""
        cause = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else exc
        if isinstance(cause, _TooLarge) or self.too_large:
            status = b"431 Request Header Fields Too Large"
        elif cause is not None and not isinstance(cause, httptools.HttpParserError):
            self.proxy.log.error("proxy failed on a request", exc_info=cause)
            self.abort()
            return
        else:
            status = b"400 Bad Request"
        if self.proxy.bad_request is not None:
            self.proxy.bad_request(str(cause or exc))
        if self.transport is None or self.closed:
            return
        if self.active is None or not self.active.responded:
            body = status + b"\n"
            head = b"HTTP/1.1 %s\r\nConnection: close\r\nContent-Type: text/plain\r\n"
            self.out.append(head % status + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        if self.active is not None and self.active.up is not None:
            self.active.up.abandon()
        self.close()


class _Upstream(asyncio.Protocol):
    """One kept-alive connection to the upstream, serving one exchange at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.client: ClientConnection | None = None
        self.req: Request | None = None
        self.out: list[bytes] = []
        self.lines: list[bytes] = []  # end-to-end header lines, CRLF, name, ": ", value
        self.dropped: set[bytes] | None = None
        self.interim = False
        self.got = False  # a byte of this exchange's response has arrived
        self.done = False  # this exchange's response is complete
        self.keep = True
        self.reused = False
        self.since = 0.0  # last activity (loop time)
        self.lost = False
        self.headers_framed = True  # False: the body runs to the end of the connection
        self.cl = self.te = False  # Content-Length, Transfer-Encoding seen

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def begin(self, client: ClientConnection, req: Request) -> None:
        self.client, self.req = client, req
        self.got = self.done = False
        self.lines = []
        self.dropped = None
        self.cl = self.te = False
        self.since = self.pool.loop.time()
        self.pool.busy.add(self)

    def flush(self) -> None:
        out = self.out
        if out and self.transport is not None:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
            out.clear()
            self.since = self.pool.loop.time()

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client is None:  # bytes on an idle connection: nothing asked, so it is unusable
            self._close()
            return
        self.got = True
        self.since = self.pool.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.keep = False
            self.pool.proxy.upstream_failed(exc, key="upstream-bytes")
            self._fail()
            return
        client.flush()
        if self.done and self.client is not None:
            self.exchange_over()

    def eof_received(self) -> bool | None:
        return False

    def pause_writing(self) -> None:
        if self.client is not None:
            self.client._block(_UPSTREAM)

    def resume_writing(self) -> None:
        if self.client is not None:
            self.client._unblock(_UPSTREAM)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.keep = False
        pool = self.pool
        pool.busy.discard(self)
        with contextlib.suppress(ValueError):
            pool.idle.remove(self)
        client, req = self.client, self.req
        if client is None or req is None or self.done:
            return
        if req.responded and not self.headers_framed:
            self.on_message_complete()  # a body delimited by the end of the connection
            client.flush()
            if self.client is not None:
                self.exchange_over()
            return
        if self.reused and not self.got and not req.has_body and not client.closed:
            # a kept-alive connection the upstream had closed: once more on a new one
            self.client = self.req = None
            req.up = None
            client.unblock_upstream()
            req.task = asyncio.get_running_loop().create_task(client._connect(req))
            return
        self.pool.proxy.upstream_failed(exc or "connection closed")
        self._fail()

    # ---- httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        lname = name.lower()
        if lname in _RESPONSE_FRAMING:
            if lname == b"content-length":
                self.cl = True
            elif lname == b"connection":
                if value.lower() not in (b"keep-alive", b"close"):
                    self.dropped = (self.dropped or set()) | _tokens(value)
                return
            elif lname == b"transfer-encoding":
                self.te = True
                return
            else:  # the other hop-by-hop headers
                return
        self.lines += (b"\r\n", name, b": ", value)

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # interim (100 Continue...): we sent no Expect, so drop it
            self.interim = True
            self.lines = []
            self.dropped = None
            self.cl = self.te = False
            return
        client, req = self.client, self.req
        if client is None or req is None:
            return
        self.keep = self.parser.should_keep_alive()
        self.headers_framed = self.cl or self.te
        lines = self.lines
        if self.dropped is not None:  # Connection named more headers: drop those too
            dropped = self.dropped
            lines = [
                part
                for i in range(0, len(lines), 4)
                if lines[i + 1].lower() not in dropped
                for part in lines[i : i + 4]
            ]
        client.response_head(req, status, b"".join(lines), self.cl, self.te)
        if req.method == b"HEAD":
            # llhttp cannot be told the response to HEAD has no body: it is complete now,
            # and the next response gets a fresh parser
            self.parser = httptools.HttpResponseParser(self)
            self.on_message_complete()

    def on_body(self, data: bytes) -> None:
        client, req = self.client, self.req
        if client is not None and req is not None and not self.done:
            client.response_body(req, data)

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        client, req = self.client, self.req
        if client is None or req is None or self.done:
            return
        self.done = True
        if not self.headers_framed:
            self.keep = False
        client.response_done(req)

    # ---- the exchange's end

    def exchange_over(self) -> None:
        """The response is complete: back to the pool once the request is sent whole."""
        req = self.req
        if req is None:
            return
        if not req.complete:  # the upstream answered before the body ended
            self.keep = False
        client = self.client
        if client is not None:
            if client.blocked & _UPSTREAM:
                client.unblock_upstream()
            if client.write_paused and self.transport is not None:
                self.transport.resume_reading()
        self.client = self.req = None
        self.pool.busy.discard(self)
        if self.keep and not self.lost:
            self.pool.release(self)
        else:
            self._close()

    def abandon(self) -> None:
        """The client went away mid-exchange."""
        self.client = self.req = None
        self.keep = False
        self._close()

    def _fail(self) -> None:
        client, req = self.client, self.req
        self.client = self.req = None
        self._close()
        if client is not None and req is not None:
            req.up = None
            client.unblock_upstream()
            client.bad_gateway(req)

    def _close(self) -> None:
        self.pool.busy.discard(self)
        if self.transport is not None:
            self.transport.close()


class Pool:
    """Kept-alive connections to the upstream; a sweep closes idle ones and times out
    exchanges whose upstream has sent nothing for ``read_timeout_s``."""

    def __init__(self, parts: Any, read_timeout_s: float, proxy: Http1Proxy) -> None:
        self.proxy = proxy
        self.name = f"{parts.scheme}://{parts.netloc}"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if parts.scheme == "https" else None
        )
        self.read_timeout_s = read_timeout_s
        self.idle: list[_Upstream] = []
        self.busy: set[_Upstream] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self.loop = asyncio.get_running_loop()

    def start(self) -> None:
        self._sweeper = self.loop.call_later(1.0, self._sweep)

    def acquire(self) -> _Upstream | None:
        idle = self.idle
        while idle:
            up = idle.pop()
            if not up.lost and up.transport is not None and not up.transport.is_closing():
                up.reused = True
                return up
        return None

    async def connect(self) -> _Upstream:
        _, up = await asyncio.wait_for(
            self.loop.create_connection(
                lambda: _Upstream(self), self.host, self.port, ssl=self.ssl
            ),
            CONNECT_TIMEOUT_S,
        )
        return up

    def release(self, up: _Upstream) -> None:
        if len(self.idle) >= POOL_MAX_IDLE:
            up._close()
            return
        up.since = self.loop.time()
        self.idle.append(up)

    def _sweep(self) -> None:
        now = self.loop.time()
        stale = [up for up in self.idle if now - up.since > POOL_IDLE_S]
        for up in stale:
            self.idle.remove(up)
            up._close()
        late = [u for u in self.busy if now - u.since > self.read_timeout_s
                and not (u.client is not None and u.client.write_paused)]  # fmt: skip
        for up in late:
            up.keep = False
            self.proxy.upstream_failed(
                TimeoutError(f"nothing from the upstream in {self.read_timeout_s:g} s")
            )
            up._fail()
        self._sweeper = self.loop.call_later(1.0, self._sweep)

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for up in [*self.idle, *self.busy]:
            up._close()
        self.idle.clear()
        self.busy.clear()


__all__ = ["HOP_BY_HOP", "ClientConnection", "Http1Proxy", "Request"]
