"""The upstream side of ``smockron proxy``: kept-alive connections to the protected
service, one exchange at a time each, in a pool.

The response is parsed by llhttp (httptools) without a Python call per header: its head
is taken whole from the bytes read (llhttp has checked it) and filtered at once
(:func:`~smockron.gatekeeper._http1_forward.response_fields`). A sweep closes idle
connections and times out exchanges whose upstream has sent nothing for
``read_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import TYPE_CHECKING, Any, Final

import httptools

from smockron.gatekeeper._http1_forward import (
    CHUNKED,
    RAW,
    Request,
    chunk,
    response_fields,
    response_head,
)

if TYPE_CHECKING:
    from smockron.gatekeeper._http1 import ClientConnection, Http1Proxy

POOL_IDLE_S: Final = 30.0
"""An idle upstream connection is closed after this long."""
POOL_MAX_IDLE: Final = 1024
CONNECT_TIMEOUT_S: Final = 5.0
MAX_RESPONSE_HEAD: Final = 1024 * 1024
"""A longer response head is an upstream failure (llhttp sets no limit of its own)."""


class Upstream(asyncio.Protocol):
    """One kept-alive connection to the upstream, serving one exchange at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.client: ClientConnection | None = None
        self.req: Request | None = None
        self.out: list[bytes] = []
        self.raw: bytes | None = None  # the bytes read until the response head is complete
        self.head_at = 0  # where in ``raw`` the response head starts (after interim ones)
        self.interim = False
        self.got = False  # a byte of this exchange's response has arrived
        self.done = False  # this exchange's response is complete
        self.keep = True
        self.reused = False
        self.since = 0.0  # last activity (loop time)
        self.lost = False
        self.framed = True  # False: the body runs to the end of the connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def begin(self, client: ClientConnection, req: Request) -> None:
        self.client, self.req = client, req
        self.got = self.done = False
        self.raw = b""
        self.head_at = 0
        self.since = self.loop.time()

    def flush(self) -> None:
        out = self.out
        if out and self.transport is not None:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
            out.clear()
            self.since = self.loop.time()  # a long upload is progress too

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client is None:  # bytes on an idle connection: nothing asked, so it is unusable
            self.close()
            return
        self.got = True
        self.since = self.loop.time()
        raw = self.raw
        if raw is not None:
            self.raw = raw + data if raw else data
            if len(self.raw) > MAX_RESPONSE_HEAD:
                self.failed(ValueError(f"response head over {MAX_RESPONSE_HEAD} bytes"))
                return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.failed(exc)
            return
        client.flush()
        if self.done and self.client is not None:
            self.exchange_over()

    def eof_received(self) -> bool | None:
        return False

    def pause_writing(self) -> None:
        if self.client is not None:
            self.client.block_upstream()

    def resume_writing(self) -> None:
        if self.client is not None:
            self.client.unblock_upstream()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.keep = False
        pool = self.pool
        pool.conns.discard(self)
        with contextlib.suppress(ValueError):
            pool.idle.remove(self)
        client, req = self.client, self.req
        if client is None or req is None or self.done:
            return
        if req.responded and not self.framed:
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
            req.task = self.loop.create_task(client.connect(req))
            return
        self.pool.proxy.upstream_failed(exc or "connection closed")
        self._fail()

    # ---- httptools callbacks (no on_header: the head is read whole)

    def on_headers_complete(self) -> None:
        raw = self.raw
        assert raw is not None
        end = raw.find(b"\r\n\r\n", self.head_at)
        status = self.parser.get_status_code()
        if status < 200:  # interim (100 Continue...): we sent no Expect, so drop it
            self.interim = True
            self.head_at = end + 4
            return
        fields = raw[raw.index(b"\r\n", self.head_at) : end]
        self.raw = None
        client, req = self.client, self.req
        if client is None or req is None:
            return
        self.keep = self.parser.should_keep_alive()
        fields, length, chunked = response_fields(fields)
        self.framed = length or chunked
        closing = client.proxy.closing
        client.out.append(response_head(req, status, fields, length, chunked, closing))
        if req.verb == b"HEAD":
            # llhttp cannot be told the response to HEAD has no body: it is complete now,
            # and the next response gets a fresh parser
            self.parser = httptools.HttpResponseParser(self)
            self.on_message_complete()

    def on_body(self, data: bytes) -> None:
        client, req = self.client, self.req
        if client is None or req is None or self.done:
            return
        if req.mode == RAW:
            client.out.append(data)
        elif req.mode == CHUNKED:
            client.out.extend(chunk(data))

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        client, req = self.client, self.req
        if client is None or req is None or self.done:
            return
        self.done = True
        if not self.framed:
            self.keep = False
        if req.mode == CHUNKED:
            client.out.append(b"0\r\n\r\n")
        client.finished(req)

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
            if client.blocked:
                client.unblock_upstream()
            if client.write_paused and self.transport is not None:
                self.transport.resume_reading()
        self.client = self.req = None
        pool = self.pool
        if self.keep and not self.lost and len(pool.idle) < POOL_MAX_IDLE:  # pool.release
            self.since = self.loop.time()
            pool.idle.append(self)
        else:
            self.close()

    def abandon(self) -> None:
        """The client went away mid-exchange."""
        self.client = self.req = None
        self.keep = False
        self.close()

    def failed(self, exc: BaseException) -> None:
        """Unusable bytes from the upstream: 502 (or a cut response), and closed."""
        self.keep = False
        self.pool.proxy.upstream_failed(exc, key="upstream-bytes")
        self._fail()

    def _fail(self) -> None:
        client, req = self.client, self.req
        self.client = self.req = None
        self.close()
        if client is not None and req is not None:
            req.up = None
            client.unblock_upstream()
            client.bad_gateway(req)

    def close(self) -> None:
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
        self.idle: list[Upstream] = []
        self.conns: set[Upstream] = set()  # every open connection, idle or in an exchange
        self._sweeper: asyncio.TimerHandle | None = None
        self.loop = asyncio.get_running_loop()

    def start(self) -> None:
        self._sweeper = self.loop.call_later(1.0, self._sweep)

    async def connect(self) -> Upstream:
        _, up = await asyncio.wait_for(
            self.loop.create_connection(lambda: Upstream(self), self.host, self.port, ssl=self.ssl),
            CONNECT_TIMEOUT_S,
        )
        self.conns.add(up)
        return up

    def release(self, up: Upstream) -> None:
        if len(self.idle) >= POOL_MAX_IDLE:
            up.close()
            return
        up.since = self.loop.time()
        self.idle.append(up)

    def _sweep(self) -> None:
        now = self.loop.time()
        stale = [up for up in self.idle if now - up.since > POOL_IDLE_S]
        for up in stale:
            self.idle.remove(up)
            up.close()
        late = [
            u
            for u in self.conns
            if u.client is not None
            and now - u.since > self.read_timeout_s
            and not u.client.write_paused
        ]
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
        for up in [*self.idle, *self.conns]:
            up.close()
        self.idle.clear()
        self.conns.clear()


__all__ = ["Pool", "Upstream"]
