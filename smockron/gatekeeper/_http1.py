"""HTTP/1.1 proxying for ``smockron proxy``: the listener and what its connections share.
Asyncio protocols (uvloop's transports when it runs the loop) with httptools (llhttp)
parsing the clients' requests: a client connection is
smockron/gatekeeper/_http1_client.py, the upstream side
smockron/gatekeeper/_http1_upstream.py, what is forwarded and how
smockron/gatekeeper/_http1_forward.py.

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
from collections.abc import Callable
from urllib.parse import urlsplit

from smockron.gatekeeper._http1_client import ClientConnection
from smockron.gatekeeper._http1_forward import HOP_BY_HOP, Request
from smockron.gatekeeper._http1_upstream import Pool
from smockron.httpguard import ConnectionGuard
from smockron.ratelog import RateLimitedLog

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
        self.loop = self.pool.loop
        self.conns: set[ClientConnection] = set()
        self.server: asyncio.AbstractServer | None = None
        self.closing = False
        self.local_host = b""
        self._sweep_s = 1.0
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int) -> None:
        self.local_host = f"{host}:{port}".encode()
        self.server = await self.loop.create_server(
            lambda: ClientConnection(self), host, port, reuse_address=True
        )
        self.pool.start()
        self._sweep_s = min(1.0, self.guard.header_timeout_s / 4)
        self._sweeper = self.loop.call_later(self._sweep_s, self._sweep)

    def _sweep(self) -> None:
        """Close connections past their header deadline (one timer for all of them,
        rather than one set and cancelled per request)."""
        now = self.loop.time()
        guard = self.guard
        for conn in [c for c in guard._idle if c.deadline <= now]:  # type: ignore[attr-defined]
            guard._timed_out(conn)  # type: ignore[arg-type]
        self._sweeper = self.loop.call_later(self._sweep_s, self._sweep)

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
        deadline = self.loop.time() + grace_s
        while self.conns and self.loop.time() < deadline:
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


__all__ = ["HOP_BY_HOP", "ClientConnection", "Http1Proxy", "Request"]
