"""JARL over TCP: on each connection write the delay, read nothing, close.

The exchange is so small that asyncio transports would cost more than the answer: the
listening socket is watched with ``add_reader`` and each ready connection is accepted,
answered with one ``send`` (a few bytes into an empty buffer never block) and closed
right there. The arrival time is the moment of ``accept``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from smockron.counters import CounterSet
from smockron.daemons.jarl.algorithm import Jarl, format_delay
from smockron.observe import CountersCollector, ObserveServer, Readiness, serve
from smockron.observe.layouts import JARL
from smockron.ratelog import RateLimitedLog
from smockron.runtime import log_stats

log = logging.getLogger("smockron.jarl")
_ratelog = RateLimitedLog(log)

ACCEPT_BATCH = 256  # connections per wake-up, so a flood cannot starve the loop
RETRY_AFTER_EMFILE = 0.1


@dataclass(slots=True)
class JarlStats(CounterSet):
    """Counts since start; the per-minute log line reports their differences."""

    answered: int = 0
    delayed: int = 0
    accept_errors: int = 0


class JarlServer:
    """A listening JARL socket with its state, stats and optional per-minute count log."""

    def __init__(
        self,
        jarl: Jarl,
        host: str,
        port: int,
        *,
        service: str = "",
        clock: Callable[[], float] = time.monotonic,
        log_every: float | None = None,
        metrics: str | None = None,
    ) -> None:
        self.jarl = jarl
        self.host = host
        self.port = port
        self.service = service
        self.stats = JarlStats()
        self._clock = clock
        self._log_every = log_every
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._log_task: asyncio.Task[None] | None = None
        self.metrics = metrics
        self.listener: ObserveServer | None = None

    def counters(self) -> dict[str, int]:
        """For /metrics: connections answered at once (accepted) or told to wait."""
        out = self.stats.as_dict()
        out["accepted"] = out.pop("answered") - out["delayed"]
        return out

    def observe(self, address: str) -> ObserveServer:
        """/metrics, /healthz, /readyz (the JARL socket is listening)."""
        registry = CollectorRegistry()
        registry.register(CountersCollector(JARL, self.counters))
        ready = Readiness({"listening": lambda: None if self._sock else "not listening"})
        return serve(address, ready, registry)

    async def start(self) -> None:
        family, kind, proto, _, address = socket.getaddrinfo(
            self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(4096)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._accept_ready)
        log.info(
            "jarl serving %r on %s:%d: %d requests per %d s",
            self.service,
            self.host,
            self.port,
            self.jarl.requests,
            self.jarl.period,
        )
        if self._log_every:
            self._log_task = asyncio.create_task(self._log_counts(self._log_every))
        if self.metrics:
            self.listener = self.observe(self.metrics)

    def _accept_ready(self) -> None:
        sock, jarl, clock, stats = self._sock, self.jarl, self._clock, self.stats
        assert sock is not None
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._accept_failed(exc)
                return
            delay = jarl.delay(clock())
            try:
                conn.send(format_delay(delay))
            except OSError:  # the client is gone already: it was counted all the same
                pass
            finally:
                conn.close()
            stats.answered += 1
            if delay:
                stats.delayed += 1

    def _accept_failed(self, exc: OSError) -> None:
        """Out of descriptors (or similar): pause accepting briefly instead of spinning."""
        self.stats.accept_errors += 1
        _ratelog.warning("cannot accept connections: %s", exc, key="accept")
        if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
            assert self._loop is not None and self._sock is not None
            fd = self._sock.fileno()
            self._loop.remove_reader(fd)
            self._loop.call_later(RETRY_AFTER_EMFILE, self._resume_accepting)

    def _resume_accepting(self) -> None:
        if self._sock is not None and self._loop is not None:
            self._loop.add_reader(self._sock.fileno(), self._accept_ready)

    async def _log_counts(self, every: float) -> None:
        answered, delayed = self.stats.answered, self.stats.delayed
        while True:
            await asyncio.sleep(every)
            now_answered, now_delayed = self.stats.answered, self.stats.delayed
            log_stats(
                log,
                {
                    "interval_s": every,
                    "answered": now_answered - answered,
                    "delayed": now_delayed - delayed,
                    "total": now_answered,
                },
            )
            answered, delayed = now_answered, now_delayed

    async def stop(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        if self._log_task is not None:
            self._log_task.cancel()
            await asyncio.gather(self._log_task, return_exceptions=True)
        if self._sock is not None and self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        log.info("jarl stopped after %d connections", self.stats.answered)
