"""One small HTTP listener per daemon: ``/metrics``, ``/healthz``, ``/readyz`` (and
``/stats`` where the daemon has one); every other path is a 404.

It runs in its own daemon thread (``http.server``), so a probe is answered even while
the daemon's event loop is busy, and the liveness probe can tell a stuck loop from a
busy one: ``/healthz`` asks the loop to run a no-op and waits for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from smockron.errors import ConfigError
from smockron.observe.readiness import Readiness
from smockron.ratelog import RateLimitedLog, escaped
from smockron.settings import parse_listen

__all__ = ["ObserveServer", "loop_alive", "parse_listen", "serve"]

log = logging.getLogger("smockron.observe")
_bad_log = RateLimitedLog(log)

LOOP_DEADLINE_S = 2.0
"""A loop that does not run a no-op within this long is reported dead by /healthz."""
REQUEST_TIMEOUT_S = 5.0
"""A probe connection idle this long is closed (a slow client cannot pin a thread)."""
MAX_CLIENTS = 32
"""Connections served at once; more are closed at once (a flood cannot spawn threads)."""

StatsSource = Callable[[], dict[str, Any]]


def loop_alive(loop: asyncio.AbstractEventLoop | None, deadline_s: float = LOOP_DEADLINE_S) -> bool:
    """Whether ``loop`` runs a callback within the deadline (None: no loop to watch)."""
    if loop is None:
        return True
    if loop.is_closed() or not loop.is_running():
        return False
    ran = threading.Event()
    try:
        loop.call_soon_threadsafe(ran.set)
    except RuntimeError:  # closed meanwhile
        return False
    return ran.wait(deadline_s)


class _Handler(BaseHTTPRequestHandler):
    server: ObserveServer
    protocol_version = "HTTP/1.0"

    def setup(self) -> None:
        self.timeout = self.server.request_timeout_s  # type: ignore[misc]
        super().setup()

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        route = self.server.routes.get(path)
        if route is None:
            self._reply(404, "text/plain; charset=utf-8", b"not found\n")
            return
        try:
            answer = route()
        except Exception as exc:  # a collector's bug must not kill the probe's answer
            _bad_log.warning("%s failed: %r", path, exc, key="route")
            answer = 500, "text/plain; charset=utf-8", b"internal error\n"
        self._reply(*answer)

    def _reply(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), escaped(format % args))

    def log_error(self, format: str, *args: Any) -> None:
        self.server.bad_requests += 1
        _bad_log.warning("bad request on the metrics listener: %r", (format % args)[:200])


class ObserveServer(ThreadingHTTPServer):
    """The listener; :meth:`close` stops it. ``loop`` is the event loop /healthz watches."""

    daemon_threads = True

    def __init__(
        self,
        address: str,
        *,
        readiness: Readiness,
        registry: CollectorRegistry = REGISTRY,
        loop: asyncio.AbstractEventLoop | None = None,
        stats: StatsSource | None = None,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        host, port = parse_listen(address)
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.request_timeout_s = request_timeout_s
        self.readiness = readiness
        self.registry = registry
        self.loop = loop
        self.bad_requests = 0
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)
        self.routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/metrics": self._metrics,
            "/healthz": self._healthz,
            "/readyz": self._readyz,
        }
        if stats is not None:
            self.routes["/stats"] = lambda: (200, "application/json", _json(stats()))
        try:
            super().__init__((host, port), _Handler)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {address}: {exc.strerror or exc}") from None
        self._thread = threading.Thread(
            target=self.serve_forever, name="smockron-observe", daemon=True
        )
        self._thread.start()
        log.info("metrics, /healthz and /readyz on http://%s:%d/", host, self.port)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.bad_requests += 1
            _bad_log.warning(
                "more than %d connections to the metrics listener: closing one",
                MAX_CLIENTS,
                key="flood",
            )
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def close(self) -> None:
        self.shutdown()
        self.server_close()

    def _metrics(self) -> tuple[int, str, bytes]:
        return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)

    def _healthz(self) -> tuple[int, str, bytes]:
        if loop_alive(self.loop):
            return 200, "text/plain; charset=utf-8", b"ok\n"
        return 503, "text/plain; charset=utf-8", b"event loop not responding\n"

    def _readyz(self) -> tuple[int, str, bytes]:
        failing = self.readiness.failing()
        if not failing:
            return 200, "application/json", _json({"ready": True, "checks": self.readiness.names})
        return 503, "application/json", _json({"ready": False, "failing": failing})


def _json(value: Any) -> bytes:
    """Compact JSON, non-ASCII escaped (identifiers from the wire stay inert)."""
    return json.dumps(value, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"


def serve(
    address: str,
    readiness: Readiness,
    registry: CollectorRegistry = REGISTRY,
    stats: StatsSource | None = None,
) -> ObserveServer:
    """Start the listener, watching the running event loop (call from inside it)."""
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    return ObserveServer(address, readiness=readiness, registry=registry, loop=loop, stats=stats)
