"""The master process: ZeroMQ SUB in, engine, ZeroMQ PUB out, on one asyncio loop.

Two tasks share a bounded queue. The receiver drains the SUB socket in batches without
blocking; when the queue is full it drops what it receives and counts it (the seed's
overload rule: dropping accounting only makes the master throttle less, never more).
The processor takes one batch at a time, runs the engine (with one Redis round trip per
batch for the Redis store) and publishes the DELAY_UNTIL messages with the domain as
topic. While the processor waits for Redis the receiver keeps draining.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections import deque
from collections.abc import Callable

import zmq

from smockron.errors import ProtocolError, SmockronError
from smockron.master.config import MasterSettings
from smockron.master.engine import Engine, Frames
from smockron.master.ratelog import RateLimitedLog
from smockron.master.receive import drain, wait_readable
from smockron.master.stats import Stats
from smockron.master.stores import MemoryStore, open_store

log = logging.getLogger("smockron.master")

MAX_FRAME_BYTES = 64 * 1024
"""ZMQ_MAXMSGSIZE: a peer sending a bigger frame is disconnected by libzmq itself."""


class Master:
    """One running master; ``run`` returns after ``stop`` (or SIGTERM/SIGINT)."""

    def __init__(
        self,
        settings: MasterSettings,
        *,
        reload: Callable[[], MasterSettings] | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        self.settings = settings
        self.reload_settings = reload
        self.stats = Stats()
        self.malformed_log = RateLimitedLog(log)
        self.store = open_store(settings.store)
        self.engine = Engine(
            settings.domains,
            self.store,
            skew_tolerance_ms=settings.skew_tolerance * 1000.0,
            stats=self.stats,
            on_malformed=self._log_malformed,
        )
        self.ctx = context or zmq.Context.instance()
        self.sub = self.ctx.socket(zmq.SUB)
        self.pub = self.ctx.socket(zmq.PUB)
        self.pending: deque[list[list[bytes]]] = deque()
        self.pending_count = 0
        self._work = asyncio.Event()
        self._stopping = asyncio.Event()

    def bind(self) -> None:
        self.sub.setsockopt(zmq.RCVHWM, self.settings.hwm)
        self.sub.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.subscribe(b"")
        self.sub.bind(self.settings.accounting)
        self.pub.setsockopt(zmq.SNDHWM, self.settings.hwm)
        self.pub.setsockopt(zmq.LINGER, 200)
        self.pub.bind(self.settings.control)
        log.info(
            "master: accounting SUB on %s, control PUB on %s, store %s, %d domain(s): %s",
            self.settings.accounting,
            self.settings.control,
            self.settings.store,
            len(self.settings.domains),
            _describe(self.settings),
        )

    def stop(self) -> None:
        self._stopping.set()
        self._work.set()

    def reload(self) -> None:
        """SIGHUP: install the config file's rules; on error keep the old ones."""
        if self.reload_settings is None:
            log.warning("SIGHUP ignored: no --config file to reload")
            return
        try:
            new = self.reload_settings()
        except SmockronError as exc:
            log.error("reload failed, keeping the current rules: %s", exc)
            return
        if new.store != self.settings.store:
            log.warning("reload: a store change (%s) needs a restart; ignored", new.store)
        self.engine.skew_tolerance_ms = new.skew_tolerance * 1000.0
        self.engine.configure(new.domains)
        self.settings = new
        log.info("reloaded: %d domain(s): %s", len(new.domains), _describe(new))

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.bind()
        for sig, handler in (
            (signal.SIGTERM, self.stop),
            (signal.SIGINT, self.stop),
            (signal.SIGHUP, self.reload),
        ):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, handler)
        tasks = [
            asyncio.create_task(self._receive(), name="receive"),
            asyncio.create_task(self._process(), name="process"),
        ]
        if self.settings.stats_interval > 0:
            tasks.append(asyncio.create_task(self._log_stats(), name="stats"))
        try:
            await self._stopping.wait()
            await tasks[1]  # the processor finishes what was received
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.remove_signal_handler(sig)
            await self.close()
            log.info("master stopped: %s", self.stats.summary())

    async def close(self) -> None:
        close = getattr(self.store, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()
        self.sub.close()
        self.pub.close()

    async def _receive(self) -> None:
        sub = self.sub
        limit = self.settings.batch
        while not self._stopping.is_set():
            batch = drain(sub, limit)
            if batch:
                self._enqueue(batch)
                await asyncio.sleep(0)
            else:
                await wait_readable(sub, 0.25)

    def _enqueue(self, batch: list[list[bytes]]) -> None:
        room = self.settings.queue - self.pending_count
        if room < len(batch):
            self._count_dropped(batch[max(room, 0) :])
            batch = batch[: max(room, 0)]
        if batch:
            self.pending.append(batch)
            self.pending_count += len(batch)
            self._work.set()

    def _count_dropped(self, dropped: list[list[bytes]]) -> None:
        self.stats.dropped += len(dropped)
        for frames in dropped:
            name = frames[0][:-1].decode("utf-8", "replace") if frames else ""
            domain = self.stats.domains.get(name)
            if domain is not None:
                domain.dropped += 1

    async def _process(self) -> None:
        redis = not isinstance(self.store, MemoryStore)
        while True:
            while self.pending:
                batch = self.pending.popleft()
                self.pending_count -= len(batch)
                if redis:
                    await self._process_redis(batch)
                else:
                    self._publish(self.engine.process(batch, time.time() * 1000.0))
                await asyncio.sleep(0)
            if self._stopping.is_set():
                return
            self._work.clear()
            await self._work.wait()

    async def _process_redis(self, batch: list[list[bytes]]) -> None:
        from smockron.master.stores.redis import RedisStore

        store = self.store
        assert isinstance(store, RedisStore)
        decoded = self.engine.decode(batch)
        try:
            await store.load(self.engine.touched(decoded))
        except Exception as exc:  # Redis down: fail permissive, count and go on
            store.discard()
            self._count_dropped([[d[0].topic] for d in decoded])
            self.malformed_log.warning("redis unavailable, batch dropped: %s", exc)
            return
        now = time.time() * 1000.0
        store.tick(now)
        self._publish(self.engine.apply(decoded, now))
        try:
            await store.flush()
        except Exception as exc:
            store.discard()
            self.malformed_log.warning("redis write failed: %s", exc)

    def _publish(self, controls: list[list[bytes]]) -> None:
        send = self.pub.send_multipart
        for frames in controls:
            try:  # noqa: SIM105 - cheaper than a context manager per message
                send(frames, zmq.NOBLOCK)
            except zmq.Again:  # PUB drops at its HWM anyway; never block the loop
                pass

    def _log_malformed(self, exc: ProtocolError, frames: Frames) -> None:
        head = [f[:40] for f in list(frames)[:3]]
        self.malformed_log.warning("malformed accounting message (%s): %s", exc, head)

    async def _log_stats(self) -> None:
        while True:
            await asyncio.sleep(self.settings.stats_interval)
            log.info("stats: %s", self.stats.summary())


def _describe(settings: MasterSettings) -> str:
    return ", ".join(
        f"{name} [{policy.algorithm}: {' '.join(map(str, policy.rules)) or 'no rules'}]"
        for name, policy in sorted(settings.domains.items())
    )
