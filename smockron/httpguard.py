"""Idle and slow connections cannot starve an aiohttp server (the proxy, the cluster's
HTTP gateway).

aiohttp closes a connection that sends nothing for its keep-alive timeout, but any byte
restarts that clock, so a client that sends its headers one byte at a time (slowloris)
holds its connection, and a descriptor, for as long as it likes; enough of them and
``accept`` fails with EMFILE for everyone, with nothing in the log. Two limits:

* **header timeout**: a connection must deliver a complete request's headers within
  ``header_timeout_s`` of opening (and of its previous response, for the next request,
  within ``idle_timeout_s``), else it is closed;
* **connection cap**: at most ``max_connections`` at once, below the descriptor limit
  (:func:`default_max_connections`). At the cap, the connection idle the longest (no
  request in progress: a slow or idle one) is closed to make room; only when every
  connection has a request in progress is the new one refused (503, then closed).

Each time a limit bites it is counted (``header_timeouts``, ``connections_evicted``,
``connections_refused``) and logged, rate-limited. Requests in progress are never cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from smockron.ratelog import RateLimitedLog, escaped

HEADER_TIMEOUT_S = 10.0
"""Default time for a new connection's first request headers (Go's usual ReadHeaderTimeout)."""
IDLE_TIMEOUT_S = 75.0
"""Default time for a kept-alive connection's next request headers (aiohttp's keep-alive)."""
RESERVED_FDS = 64
"""Descriptors kept out of the cap for everything else (sockets to the master, files...)."""

_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 30\r\n\r\n503 too many open connections\n"
)


def default_max_connections(fds_per_connection: int = 1) -> int:
    """The cap under this process's RLIMIT_NOFILE: a proxy needs two descriptors per
    client connection (the client's and the upstream's)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 65_536
    reserve = max(RESERVED_FDS, soft // 8)
    return max(8, (soft - reserve) // max(1, fds_per_connection))


class ConnectionGuard:
    """The two limits for one listener, and what they counted."""

    def __init__(
        self,
        log: logging.Logger,
        *,
        header_timeout_s: float = HEADER_TIMEOUT_S,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        max_connections: int | None = None,
        fds_per_connection: int = 1,
        counted: Callable[[str], None] | None = None,
    ) -> None:
        """``counted``: also told each event's name (a Prometheus counter's label)."""
        self._counted = counted
        self.header_timeout_s = header_timeout_s
        self.idle_timeout_s = max(idle_timeout_s, header_timeout_s)
        self.max_connections = max_connections or default_max_connections(fds_per_connection)
        self.header_timeouts = 0
        self.connections_evicted = 0
        self.connections_refused = 0
        self._log = RateLimitedLog(log, burst=3)
        self._open: dict[Any, _Guarded] = {}  # transport -> connection
        self._idle: OrderedDict[_Guarded, None] = OrderedDict()  # longest idle first

    @property
    def open(self) -> int:
        return len(self._open)

    def stats(self) -> dict[str, int]:
        return {
            "header_timeouts": self.header_timeouts,
            "connections_evicted": self.connections_evicted,
            "connections_refused": self.connections_refused,
        }

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """The protocol factory to give ``create_server`` instead of aiohttp's."""
        return lambda: _Guarded(self, inner)

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Headers complete: the connection is busy (no timeout) until the handler returns."""
        conn = self._open.get(request.transport)
        if conn is None:
            return await handler(request)
        conn.begin()
        try:
            return await handler(request)
        finally:
            conn.end()

    def _admit(self, conn: _Guarded, transport: asyncio.BaseTransport) -> bool:
        while len(self._open) >= self.max_connections:
            if not self._idle:
                self._count("connections_refused")
                self._log.warning(
                    "%d connections open, all with a request in progress: "
                    "refused one from %s (503)",
                    len(self._open),
                    _peer(transport),
                    key="refused",
                )
                return False
            oldest, _ = self._idle.popitem(last=False)
            self._count("connections_evicted")
            self._log.warning(
                "%d connections open (the cap): closed the longest idle, from %s",
                len(self._open),
                _peer(oldest.transport),
                key="evicted",
            )
            self._open.pop(oldest.transport, None)  # closing: its descriptor is as good as free
            oldest.close()
        self._open[transport] = conn
        return True

    def _count(self, event: str) -> None:
        setattr(self, event, getattr(self, event) + 1)
        if self._counted is not None:
            self._counted(event)

    def _timed_out(self, conn: _Guarded) -> None:
        self._count("header_timeouts")
        self._log.warning(
            "closed a connection from %s: no complete request headers in %g s",
            _peer(conn.transport),
            conn.timeout_s,
            key="timeout",
        )
        conn.close()

    def _gone(self, conn: _Guarded) -> None:
        self._idle.pop(conn, None)
        if self._open.get(conn.transport) is conn:
            del self._open[conn.transport]


def _peer(transport: asyncio.BaseTransport | None) -> object:
    peer = transport.get_extra_info("peername") if transport is not None else None
    return escaped(peer[0] if isinstance(peer, tuple) and peer else peer)


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, with its header timer."""

    def __init__(self, guard: ConnectionGuard, inner: Callable[[], asyncio.Protocol]) -> None:
        self.guard = guard
        self._make = inner
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.BaseTransport | None = None
        self.busy = 0
        self.timeout_s = guard.header_timeout_s
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if not self.guard._admit(self, transport):
            with contextlib.suppress(Exception):
                transport.write(_REFUSAL)  # type: ignore[attr-defined]
            transport.close()
            return
        self.inner = self._make()
        self.inner.connection_made(transport)
        self._wait_headers(self.guard.header_timeout_s)

    def _wait_headers(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.guard._idle[self] = None
        self._timer = asyncio.get_running_loop().call_later(timeout_s, self.guard._timed_out, self)

    def begin(self) -> None:
        self.busy += 1
        self.guard._idle.pop(self, None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def end(self) -> None:
        self.busy -= 1
        transport = self.transport
        if self.busy == 0 and self.inner is not None and transport and not transport.is_closing():
            self._wait_headers(self.guard.idle_timeout_s)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.guard._idle.pop(self, None)
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.guard._gone(self)
        if self.inner is not None:
            self.inner.connection_lost(exc)


class GuardedSite(web.BaseSite):
    """aiohttp's TCPSite with its connections behind a :class:`ConnectionGuard`."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        guard: ConnectionGuard,
        *,
        ssl_context: Any = None,
        reuse_address: bool | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host, self._port, self._guard = host, port, guard
        self._reuse_address = reuse_address

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self._guard.factory(server),
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
        )
