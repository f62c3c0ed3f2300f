"""JARL over TCP: on each connection write the delay, read nothing, close."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from smockron.daemons.jarl import Jarl, format_delay

log = logging.getLogger("smockron.jarl")


@dataclass(slots=True)
class JarlStats:
    """Counts since start; the per-minute log line reports their differences."""

    answered: int = 0
    delayed: int = 0


class JarlProtocol(asyncio.Protocol):
    """Answers in ``connection_made``: the arrival time is when the connection is accepted."""

    __slots__ = ("_clock", "_jarl", "_stats")

    def __init__(self, jarl: Jarl, stats: JarlStats, clock: Callable[[], float]) -> None:
        self._jarl = jarl
        self._stats = stats
        self._clock = clock

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.WriteTransport, transport)  # uvloop's is not a subclass
        delay = self._jarl.delay(self._clock())
        stats = self._stats
        stats.answered += 1
        if delay:
            stats.delayed += 1
        transport.write(format_delay(delay))
        transport.close()

    def data_received(self, data: bytes) -> None:
        """Clients are not expected to send anything; whatever they send is ignored."""


class JarlServer:
    """A listening JARL socket with its state, stats and optional per-minute count log."""

    def __init__(
        self,
        jarl: Jarl,
        host: str,
        port: int,
        *,
        service: str = "",
        clock: Callable[[], float] = time.time,
        log_every: float | None = None,
    ) -> None:
        self.jarl = jarl
        self.host = host
        self.port = port
        self.service = service
        self.stats = JarlStats()
        self._clock = clock
        self._log_every = log_every
        self._server: asyncio.Server | None = None
        self._log_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: JarlProtocol(self.jarl, self.stats, self._clock),
            self.host,
            self.port,
            backlog=4096,
            reuse_address=True,
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info(
            "jarl serving %r on %s:%d: %d requests per %d s",
            self.service, self.host, self.port, self.jarl.requests, self.jarl.period,
        )  # fmt: skip
        if self._log_every:
            self._log_task = asyncio.create_task(self._log_counts(self._log_every))

    async def _log_counts(self, every: float) -> None:
        answered, delayed = self.stats.answered, self.stats.delayed
        while True:
            await asyncio.sleep(every)
            now_answered, now_delayed = self.stats.answered, self.stats.delayed
            log.info(
                "last %gs: %d connections answered, %d told to wait (total %d)",
                every, now_answered - answered, now_delayed - delayed, now_answered,
            )  # fmt: skip
            answered, delayed = now_answered, now_delayed

    async def stop(self) -> None:
        if self._log_task is not None:
            self._log_task.cancel()
            await asyncio.gather(self._log_task, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        log.info("jarl stopped after %d connections", self.stats.answered)
