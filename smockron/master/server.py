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

from smockron import runtime
from smockron.curve import (
    AllowList,
    CurveClient,
    allow_ipv6,
    bind_mode,
    curve_server,
    tcp_keepalive,
)
from smockron.errors import ProtocolError, SmockronError
from smockron.master.answers import Answers
from smockron.master.config import MasterSettings, limits
from smockron.master.control_out import ControlOut
from smockron.master.engine import Decoded, Engine, Frames
from smockron.master.fleet import Fleet, Peer, PeerWatch, WarmStart
from smockron.master.stats import Stats
from smockron.master.stores import open_store
from smockron.observe import ObserveServer, Readiness
from smockron.observe.throttled import TopThrottled
from smockron.ratelog import RateLimitedLog
from smockron.wire.accounting import drain_accounting
from smockron.wire.batchio import Readable
from smockron.wire.codec import encode_published, encode_rules

log = logging.getLogger("smockron.master")

Batch = tuple[list[Decoded], list[Frames], float]
"""Records decoded while received, raw messages for the engine's codec, and when they
were received (ms): skew and lateness are judged by it, not by when they are processed."""

FLUSH_IDLE_S = 0.05
"""An idle master with the Redis store writes what changed after this long."""
IDLE_TICK_S = 0.1
"""An idle master with the memory store ticks it this often: expired states are
released (and their memory returned) without waiting for the next message."""

PUBLISH_EVERY = 64
"""A large batch is applied and its DELAY_UNTILs published in slices of this many
messages (~0.1 ms of work each), so the reaction time does not grow with the batch."""

RULES_EVERY_S = 1.0
"""How often each domain's rules are offered to gatekeepers (see protocol.py): a
gatekeeper that (re)connects has its first line within this long."""

MAX_FRAME_BYTES = 64 * 1024
"""ZMQ_MAXMSGSIZE: a peer sending a bigger frame is disconnected by libzmq itself."""

STORE_CHECK_S = 2.0
"""How often the store is pinged for /readyz (and a silent outage is noticed)."""
STORE_DEADLINE_S = 2.0
"""A ping not answered within this long counts as a failure."""
STORE_REWARN_S = 60.0
"""An unreachable store is warned about again at most this often."""


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
        self.malformed_log = RateLimitedLog(log, burst=10)
        self.store = open_store(
            settings.store, snapshot=settings.snapshot, snapshot_interval=settings.snapshot_interval
        )
        self.fleet = Fleet(settings)
        self.engine = Engine(
            settings.domains,
            self.store,
            skew_tolerance_ms=settings.skew_tolerance * 1000.0,
            limits=limits(settings),
            stats=self.stats,
            on_malformed=self._log_malformed,
            shards=self.fleet.shards,
        )
        self.curve = curve_server(settings.curve_secret, settings.curve_clients)
        self.auth: AllowList | None = None
        self.ctx = context or zmq.Context.instance()
        self.sub = self.ctx.socket(zmq.SUB)
        self.pub = self.ctx.socket(zmq.PUB)
        self.out = ControlOut(self.pub)  # every message published goes through it
        self._offers: dict[str, list[bytes]] = {}  # domain -> its RULES offer
        self._encode_offers()
        self.monitor: zmq.Socket[bytes] | None = None
        self.pending: deque[Batch] = deque()
        self.pending_count = 0
        self._work = asyncio.Event()
        self._stopping = asyncio.Event()
        self.throttled = TopThrottled()  # for /stats and smockron top
        self.bound = False
        # why the store is unreachable (readiness); not ready until its first ping answers
        self.store_problem: str | None = f"store {settings.store} not checked yet"
        self.listener: ObserveServer | None = None
        self.answers = Answers(self.engine, self.store, self.out, self.stats, self._offers)
        self.warm: WarmStart | None = None
        self.watch: PeerWatch | None = None
        if not self.fleet.alone and self.store.warm_start:  # not ready until it ran
            self.warm = WarmStart(self.ctx, self.fleet, self.answers.merge, self._peer_curve())
            warm = self.warm
            self.answers.warming = lambda: warm.problem is not None
            self.watch = PeerWatch(self.ctx, self.fleet, self._catch_up, self._peer_curve())
        self._catching_up: set[asyncio.Task[None]] = set()
        self._subscribed: list[bytes] = []

    @property
    def resyncs(self) -> int:
        return self.answers.resyncs

    def readiness(self) -> Readiness:
        """/readyz: sockets bound, store reachable (its last ping answered in time)."""
        return Readiness(
            {
                "bound": lambda: None if self.bound else "sockets not bound yet",
                "store": lambda: self.store_problem,
                "fleet": lambda: None if self.warm is None else self.warm.problem,
            }
        )

    def observe(self, address: str) -> ObserveServer:
        from smockron.master.metrics import serve_metrics

        return serve_metrics(
            address,
            self.stats,
            lambda: self.pending_count,
            readiness=self.readiness(),
            throttled=self.throttled,
            store=self.store,
        )

    async def _watch_store(self) -> None:
        """Ping the store on the loop; record the outcome for /readyz, and warn (once a
        minute at most) while it does not answer, even with no traffic to notice."""
        ping = self.store.ping
        warned = -STORE_REWARN_S
        down = False  # the first answer after start is no "again"
        while True:
            try:
                await asyncio.wait_for(ping(), STORE_DEADLINE_S)
            except Exception as exc:
                down = True
                reason = str(exc) or type(exc).__name__
                self.store_problem = f"store {self.settings.store} unreachable: {reason}"
                if time.monotonic() - warned >= STORE_REWARN_S:
                    warned = time.monotonic()
                    log.warning(
                        "%s (not ready until it answers; deciding from memory)", self.store_problem
                    )
            else:
                if down:
                    log.info("store %s answers again", self.settings.store)
                down = False
                self.store_problem = None
                warned = -STORE_REWARN_S
            await asyncio.sleep(STORE_CHECK_S)

    def secure(self) -> None:
        """Protected mode, then CURVE and its ZAP handler on both sockets, before they
        bind: a non-loopback address without keys is refused (InsecureBindError)."""
        endpoints = (self.settings.accounting, self.settings.control)
        allowed = None
        if self.curve is not None:
            self.auth = self.curve.allow_list(self.ctx, self._auth_denied)
            allowed = len(self.auth.keys)
            for sock in (self.sub, self.pub):
                self.curve.secure(sock)
        level, line = bind_mode(endpoints, allowed, self.settings.insecure_bind)
        log.log(level, line)

    def _auth_denied(self) -> None:
        self.stats.auth_denied += 1

    def bind(self) -> None:
        self.secure()
        if not self.settings.domains:
            log.warning("no rules configured: every accounting message will be ignored")
        self.sub.setsockopt(zmq.RCVHWM, self.settings.hwm)
        self.sub.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self.sub.setsockopt(zmq.LINGER, 0)
        self._subscribe()
        allow_ipv6(self.sub, self.settings.accounting)
        allow_ipv6(self.pub, self.settings.control)
        tcp_keepalive(self.sub)  # a partitioned gatekeeper's connection is dropped
        tcp_keepalive(self.pub)  # ...and a slow one is not
        self.sub.bind(self.settings.accounting)
        # Connections accepted: what a gatekeeper queued meanwhile comes right after
        # (with CURVE, once its key is allowed: a denied peer is no gatekeeper).
        event = zmq.EVENT_HANDSHAKE_SUCCEEDED if self.curve else zmq.EVENT_ACCEPTED
        self.monitor = self.sub.get_monitor_socket(event)
        self.pub.setsockopt(zmq.SNDHWM, self.settings.hwm)
        self.pub.setsockopt(zmq.LINGER, 200)
        self.pub.bind(self.settings.control)
        self.bound = True
        log.info(
            "master: accounting SUB on %s, control PUB on %s, store %s, fleet: %s, "
            "%d domain(s): %s",
            self.settings.accounting,
            self.settings.control,
            self.settings.store,
            self.fleet.describe(),
            len(self.settings.domains),
            _describe(self.settings),
        )

    def _subscribe(self) -> None:
        """Subscribe to what the fleet says (everything, for a fleet of one)."""
        wanted = self.fleet.subscriptions(self.settings.domains)
        for old in set(self._subscribed) - set(wanted):
            self.sub.unsubscribe(old)
        for new in set(wanted) - set(self._subscribed):
            self.sub.subscribe(new)
        self._subscribed = wanted

    def stop(self) -> None:
        self._stopping.set()
        self._work.set()

    def reload(self) -> None:
        """SIGHUP: read the allowed keys again, and install the config file's rules; on
        error keep the old ones."""
        if self.auth is not None:
            log.info(
                "control plane: CURVE, %d allowed gatekeeper key(s)",
                self.auth.reload(self.sub, self.pub),
            )
        if self.reload_settings is None:
            if self.auth is None:
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
        self.engine.limits = limits(new)
        self.engine.configure(new.domains)
        self.settings = new
        self._subscribe()
        self._encode_offers()
        self.offer_rules()
        log.info("reloaded: %d domain(s): %s", len(new.domains), _describe(new))

    async def run(self, *, handle_signals: bool = True) -> None:
        """Serve until ``stop``; with ``handle_signals`` SIGTERM/SIGINT call it (the
        ``smockron`` command leaves signals to smockron.runtime instead)."""
        loop = asyncio.get_running_loop()
        try:
            self.bind()
            if self.settings.metrics:
                self.listener = self.observe(self.settings.metrics)
        except BaseException:
            await self.close()
            raise
        for sig, handler in (
            (signal.SIGTERM, self.stop),
            (signal.SIGINT, self.stop),
            (signal.SIGHUP, self.reload),
        ):
            if handle_signals:
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, handler)
        tasks = [
            asyncio.create_task(self._receive(), name="receive"),
            asyncio.create_task(self._process(), name="process"),
        ]
        if self.settings.stats_interval > 0:
            tasks.append(asyncio.create_task(self._log_stats(), name="stats"))
        tasks.append(asyncio.create_task(self._offer_rules(), name="rules"))
        tasks.append(asyncio.create_task(self.answers.answer_resyncs(), name="resync"))
        tasks.append(asyncio.create_task(self.answers.answer_syncs(), name="sync"))
        if self.warm is not None:
            tasks.append(asyncio.create_task(self.warm.run(), name="warm start"))
        if self.watch is not None:
            tasks.append(asyncio.create_task(self.watch.run(), name="peer watch"))
        tasks.append(asyncio.create_task(self._watch_store(), name="store"))
        try:
            await self._stopping.wait()
            await tasks[1]  # the processor finishes what was received
        finally:
            tasks.extend(self._catching_up)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP) if handle_signals else ():
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.remove_signal_handler(sig)
            await self.close()
            runtime.log_stats(log, self.stats.fields(), event="stopped")

    async def close(self) -> None:
        """Write what changed (Redis), then close the store and the sockets."""
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        try:
            await self.store.flush(wait=True)
        except Exception as exc:
            log.warning("final write to the store failed: %s", exc)
        with contextlib.suppress(Exception):
            await self.store.close()
        if self.monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.sub.disable_monitor()
            self.monitor.close(0)
        self.sub.close()
        self.pub.close()
        if self.auth is not None:
            self.auth.stop()

    async def _receive(self) -> None:
        sub = self.sub
        limit = self.settings.batch
        engine = self.engine
        monitor = self.monitor
        readable = Readable(sub, asyncio.get_running_loop())
        try:
            while not self._stopping.is_set():
                # decoded while received; topics and limits are read per batch: SIGHUP
                # may change them
                decoded, raw = drain_accounting(sub, limit, engine.topics, engine.limits)
                # connections after the drain: a backlog drained before its connection's
                # event was read is still judged as one
                if monitor is not None and int(monitor.get(zmq.EVENTS)) & zmq.POLLIN:
                    self._connections(monitor)
                if decoded or raw:
                    self._enqueue((decoded, raw, time.time() * 1000.0))
                    await asyncio.sleep(0)
                else:
                    await readable.wait(0.25)
        finally:
            readable.close()

    def _connections(self, monitor: zmq.Socket[bytes]) -> None:
        """Tell the engine a gatekeeper connected, so it knows the backlog for what it is."""
        while True:
            try:
                monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self.engine.connected(time.time() * 1000.0)

    def _enqueue(self, batch: Batch) -> None:
        decoded, raw, arrived = batch
        room = self.settings.queue - self.pending_count
        if room < len(decoded) + len(raw):  # full: drop the newest, and count them
            room = max(room, 0)
            keep_decoded, room = decoded[:room], room - len(decoded[:room])
            keep_raw = raw[:room]
            self._count_dropped(decoded[len(keep_decoded) :], raw[len(keep_raw) :])
            decoded, raw = keep_decoded, keep_raw
        if decoded or raw:
            self.pending.append((decoded, raw, arrived))
            self.pending_count += len(decoded) + len(raw)
            self._work.set()

    def _count_dropped(self, decoded: list[Decoded], raw: list[Frames]) -> None:
        self.stats.dropped += len(decoded) + len(raw)
        for item in decoded:
            item[0].stats.dropped += 1
        for frames in raw:
            name = frames[0][:-1].decode("utf-8", "replace") if frames else ""
            domain = self.stats.domains.get(name)
            if domain is not None:
                domain.dropped += 1

    async def _process(self) -> None:
        """One loop for every store: ``Store`` says what to load and when to write."""
        store = self.store
        idle_s = FLUSH_IDLE_S if store.writes_behind else IDLE_TICK_S
        loop = asyncio.get_running_loop()
        while True:
            while self.pending:
                fast, raw, arrived = self.pending.popleft()
                self.pending_count -= len(fast) + len(raw)
                self.stats.batches += 1
                await self._process_batch(self.engine.ingest(fast, raw), arrived)
                self.answers.asked()  # RESYNC or SYNC requests in it: answered now
                del fast, raw  # not kept while idle: they would pin memory (smockron.memory)
                await asyncio.sleep(0)
            if self._stopping.is_set():
                return
            # idle: what changed is written after at most one interval, and states still
            # expire and are released (memory goes back). The interval's end sets the
            # event too: no task and timeout per wait, as wait_for makes (one a batch)
            self._work.clear()
            timer = loop.call_later(idle_s, self._work.set)
            try:
                await self._work.wait()
            finally:
                timer.cancel()
            if not self.pending and not self._stopping.is_set():  # the interval passed
                store.tick(time.time() * 1000.0)
                await store.flush(wait=False)

    async def _process_batch(self, decoded: list[Decoded], arrived: float | None = None) -> None:
        """Load what the batch touches (Redis: one round trip; memory: nothing), apply it,
        and write when the store says it is due."""
        store = self.store
        now = time.time() * 1000.0
        store.tick(now)
        if await store.load(self.engine.touched(decoded)):  # time passed: read it again
            now = time.time() * 1000.0
            store.tick(now)
        self._apply(decoded, now, arrived)
        if store.due(now):
            await store.flush(wait=False)

    def _apply(self, decoded: list[Decoded], now: float, arrived: float | None = None) -> None:
        """Apply a batch and publish its DELAY_UNTILs, ``PUBLISH_EVERY`` messages at a
        time: a DELAY_UNTIL early in a large batch (after a stall, or at full load) is
        sent without waiting for the rest of the batch to be applied."""
        apply, out = self.engine.apply, self.out
        for start in range(0, len(decoded), PUBLISH_EVERY):
            controls = apply(decoded[start : start + PUBLISH_EVERY], now, arrived)
            if controls:
                out.send(controls)
                if self.listener is not None:  # only /stats reads them
                    self.throttled.add(controls, now / 1000.0)

    def offer_rules(self) -> None:
        """Publish every domain's rules once, for the gatekeepers' first line, and each
        domain's count of DELAY_UNTILs published (the gatekeepers' loss detection)."""
        counts = [
            encode_published(name, self.stats.domain(name).published)
            for name in sorted(self.engine.domains)
        ]
        with contextlib.suppress(zmq.ZMQError):
            self.out.send([*self._offers.values(), *counts])

    async def resync(self, name: str, reply: bytes | None = None) -> int:
        """Answer a RESYNC now (see :mod:`smockron.master.answers`)."""
        return await self.answers.resync(name, reply)

    def _catch_up(self, peer: Peer) -> None:
        """A peer heard again after a silence: take its states of our shards (what we
        missed if the silence was ours), in the background."""
        if self.warm is None:
            return
        self.stats.peer_returns += 1
        task = asyncio.create_task(self.warm.catch_up(peer), name=f"catch up {peer.accounting}")
        self._catching_up.add(task)
        task.add_done_callback(self._catching_up.discard)

    def _peer_curve(self) -> CurveClient | None:
        """A fleet shares the master key pair: peers are reached as CURVE clients that
        hold it and pin its public key (each master allows that key)."""
        if self.curve is None:
            return None
        return CurveClient(self.curve.keypair, self.curve.keypair.public)

    def _encode_offers(self) -> None:
        """The rules offers of the rules in force (encoded once per configuration)."""
        domains = sorted(self.engine.domains.items())
        self._offers.clear()  # in place: the answers read the same dict
        self._offers.update(
            {name: encode_rules(name, p.algorithm, p.rules) for name, p in domains if p.rules}
        )

    async def _offer_rules(self) -> None:
        while True:
            self.offer_rules()
            await asyncio.sleep(RULES_EVERY_S)

    def _log_malformed(self, exc: ProtocolError, frames: Frames) -> None:
        head = [f[:40] for f in list(frames)[:3]]
        self.malformed_log.warning("malformed accounting message (%s): %s", exc, head)

    async def _log_stats(self) -> None:
        while True:
            await asyncio.sleep(self.settings.stats_interval)
            runtime.log_stats(log, self.stats.fields())


def _describe(settings: MasterSettings) -> str:
    return ", ".join(
        f"{name} [{policy.algorithm}: {' '.join(map(str, policy.rules)) or 'no rules'}]"
        for name, policy in sorted(settings.domains.items())
    )
