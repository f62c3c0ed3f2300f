"""One client connection of ``smockron proxy`` (an asyncio protocol fed by httptools'
llhttp parser): its requests parsed in the parser's callbacks, answered in order,
their bodies streamed to the upstream with flow control. The listener and what the
connections share are in smockron/gatekeeper/_http1.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any, Final

import httptools

from smockron.gatekeeper._http1_forward import (
    CONTINUE,
    FRAMING,
    MAX_FIELD,
    MAX_HEAD,
    Request,
    chunk,
    framing_header,
    own_response,
    request_head,
)
from smockron.gatekeeper._http1_upstream import Upstream
from smockron.httpguard import _REFUSAL

if TYPE_CHECKING:
    from smockron.gatekeeper._http1 import Http1Proxy

HIGH_WATER: Final = 256 * 1024
"""Request body bytes held before reading from the client pauses (no upstream yet)."""

# flags for why reading from a client is paused
_BODY, _PIPELINE, _UPSTREAM = 1, 2, 4


class _TooLarge(Exception):
    pass


class ClientConnection(asyncio.Protocol):
    """One client connection: parses its requests, answers them in order."""

    def __init__(self, proxy: Http1Proxy) -> None:
        self.proxy = proxy
        self.pool = proxy.pool
        self.guard = proxy.guard
        self.idle: OrderedDict[Any, None] = proxy.guard._idle  # the guard's, by connection
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.peer: str | None = None
        self.peer_bytes = b"unknown"  # as X-Forwarded-For ends
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
        if not self.guard._admit(self, transport):  # type: ignore[arg-type]
            self.closed = True
            with contextlib.suppress(Exception):
                transport.write(_REFUSAL)  # type: ignore[attr-defined]
            transport.close()
            return
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if isinstance(peer, tuple) and peer else None
        if self.peer:
            self.peer_bytes = self.peer.encode()
        self.proxy.conns.add(self)
        self.deadline = self.proxy.loop.time() + self.timeout_s
        self.idle[self] = None

    def data_received(self, data: bytes) -> None:
        req = self.req
        if req is None or not req.verb:
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
        if (req is None or not req.verb) and self.head_bytes > MAX_HEAD:
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
        if self.req is not None and not self.req.complete and self.req.verb:
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
        self.guard._gone(self)  # type: ignore[arg-type]
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
        self.req = Request(self.peer)

    def on_url(self, url: bytes) -> None:
        req = self.req
        assert req is not None
        req.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        req = self.req
        assert req is not None
        size = len(name) + len(value)
        req.held += size + 4
        if size > MAX_FIELD or req.held > MAX_HEAD:
            self.too_large = True
            raise _TooLarge(
                f"header line over {MAX_FIELD} bytes"
                if size > MAX_FIELD
                else f"request head over {MAX_HEAD} bytes"
            )
        lname = name.lower()
        req.headers.append((lname, name, value))
        if lname in FRAMING:
            framing_header(req, lname, value)

    def on_headers_complete(self) -> None:
        req = self.req
        assert req is not None
        parser = self.parser
        req.set_verb(parser.get_method())
        req.keep_alive = parser.should_keep_alive()
        req.http11 = parser.get_http_version() == "1.1"
        req.held = 0  # counted the head's bytes, now counts the body's held ones
        self.head_bytes = 0
        if not self.busy:
            self.idle.pop(self, None)
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
                up.out.extend(chunk(data))
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
        proxy = self.proxy
        req.head = request_head(
            req, proxy.prefix, proxy.host_header, self.peer_bytes, proxy.local_host
        )
        idle = self.pool.idle  # a kept-alive connection (no method call: once a request)
        while idle:
            up = idle.pop()
            transport = up.transport
            if not up.lost and transport is not None and not transport.is_closing():
                up.reused = True
                self._attach(req, up)
                return
        req.task = proxy.loop.create_task(self.connect(req))

    async def connect(self, req: Request) -> None:
        """``req`` on a new upstream connection (502 when there is none to be had)."""
        try:
            up = await self.pool.connect()
        except (OSError, TimeoutError) as exc:
            req.task = None
            self.proxy.upstream_failed(exc)
            self.bad_gateway(req)
            return
        req.task = None
        if self.closed or req is not self.active:
            self.pool.release(up)
            return
        self._attach(req, up)

    def _attach(self, req: Request, up: Upstream) -> None:
        req.up = up
        up.begin(self, req)
        if req.expect and not req.complete and self.transport is not None:
            self.transport.write(CONTINUE)
        out = up.out
        out.append(req.head)
        pending = req.pending
        if pending:
            if req.chunked:
                for data in pending:
                    out.extend(chunk(data))
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

    def respond(
        self, req: Request, status_line: bytes, headers: bytes, body: bytes, extra: bytes = b""
    ) -> None:
        """A response of our own (rejection, 502): ``headers`` are ``Name: value\\r\\n``
        lines, without Content-Length."""
        if self.closed or req.responded:
            return
        self.out.append(own_response(req, status_line, headers + extra, body, self.proxy.closing))
        req.pending = None
        self._unblock(_BODY)
        self.finished(req)

    def bad_gateway(self, req: Request) -> None:
        if req.responded:  # headers are gone: cut the connection, the truncation shows
            self.flush()
            self.close()
            return
        self.respond(
            req,
            b"502 Bad Gateway",
            b"Content-Type: text/plain; charset=utf-8\r\n",
            b"502 Bad Gateway: upstream unavailable\n",
            req.extra,
        )

    def finished(self, req: Request) -> None:
        """``req``'s response is out (its upstream's last bytes are in ``out``)."""
        req.up = None
        self.active = None
        self.busy -= 1
        if req.close_after or self.closed:
            self.close()
            return
        if not self.busy:
            idle_timeout_s = self.guard.idle_timeout_s
            self.timeout_s = idle_timeout_s
            self.deadline = self.proxy.loop.time() + idle_timeout_s
            self.idle[self] = None
        if self.queue:
            self.proxy.loop.call_soon(self._next)
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

    def block_upstream(self) -> None:
        self._block(_UPSTREAM)

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
