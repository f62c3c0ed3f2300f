"""``smockron router``: what gatekeepers connect to when there are several masters.

Accounting: gatekeepers publish to the router's SUB. With ``shard_by="domain"`` (the
default) each message goes to the one master that owns its domain on a consistent-hash
ring of the masters' accounting addresses (a master's share moves only when masters are
added or removed), through one PUB per master: the original Smockron's rule, "all
messages for the same domain go to the same master". With ``shard_by="identifier"`` each
message is published on its identifier's shard topic (:mod:`smockron.core.shards`)
through one PUB connected to every master, and ZeroMQ's subscription filtering hands it
to the masters holding that shard (a fleet: masters peered with ``--peer``); RESYNCs
keep their domain topic, which every master of the fleet subscribes to, so each master
answers for the verdicts it holds.

Control: one SUB per master, so the router knows which master sent what. DELAY_UNTILs,
RESYNC answers and everything else are relayed unchanged to the gatekeepers through the
router's PUB, with three exceptions:

* the masters' publish counters (``PUBLISHED``) are not relayed. Each master counts only
  its own DELAY_UNTILs, so relayed as they are they would read, at a gatekeeper that
  hears them as one master's, as losses and restarts. The router publishes its own
  counter per domain instead (:class:`Counters`): the DELAY_UNTILs it relayed for the
  domain plus those the masters' counters show it never received. It never decreases
  while the router runs, and a gatekeeper reading it finds exactly what was lost on the
  way from any master to it;
* the rules offers, which every master sends for every domain once a second, are relayed
  about once a second per domain (:class:`Offers`), and at once when they change or
  precede a resync's answer;
* a master's answers to its peers' warm start (``\\0smockron-sync\\0...``), which the
  router receives (it subscribes to everything: the domains are the masters' to know)
  and drops.

Hostile input: the accounting SUB has the master's frame size limit (ZMQ_MAXMSGSIZE), so
a gatekeeper sending a huge frame loses its own connection to the router rather than
making the router forward it and the master drop the router's connection, which carries
every other gatekeeper's traffic. A message without a domain, with more frames than any
valid message has (``MAX_FRAMES``: the router would forward only the first ones), on a
topic of the masters' own (``\\0smockron...``: a gatekeeper has no business asking a
master for its peers' sync), or (sharding by identifier) without an identifier to shard
by, is discarded, counted and logged (rate-limited) with its real length; other
malformed messages go to a master, which counts and logs them by reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
import zlib
from collections.abc import Sequence

import zmq
from prometheus_client import CollectorRegistry
from zmq.utils.monitor import parse_monitor_message

from smockron.core.hashring import HashRing
from smockron.core.shards import SHARD_PREFIX, SHARDS, shard_topics
from smockron.curve import (
    HANDSHAKE_FAILED,
    REDIAL_S,
    AllowList,
    CurveClient,
    CurveServer,
    allow_ipv6,
    bind_mode,
)
from smockron.errors import ConfigError
from smockron.master.fleet import Peer
from smockron.master.relay import Counters, Offers
from smockron.master.server import MAX_FRAME_BYTES
from smockron.master.upstream import _ControlRelay, _Upstream
from smockron.observe import CountersCollector, ObserveServer, Readiness, serve
from smockron.observe.layouts import ROUTER
from smockron.ratelog import RateLimitedLog
from smockron.wire.batchio import Readable, drain, send_all
from smockron.wire.codec import (
    MAX_FRAMES,
    RESYNC,
    frame_count,
)

log = logging.getLogger("smockron.router")

OWNER_CACHE = 65_536
"""Domains whose owner (or shard topics) is memoised; a flood of random domains only
resets the cache."""
SHARD_BY = ("domain", "identifier")
MASTERS_PREFIX = b"\0smockron"
"""Topics of messages between masters (sync requests): never from a gatekeeper."""
_WATCHED = HANDSHAKE_FAILED | zmq.EVENT_DISCONNECTED
"""What the monitors of the sockets towards the masters report (:meth:`Router._events`)."""


MasterAddress = Peer
"""A master's accounting and control addresses: the fleet's :class:`Peer`, one type."""


class Router(_ControlRelay):
    def __init__(
        self,
        accounting: str,
        control: str,
        masters: Sequence[MasterAddress],
        *,
        shard_by: str = "domain",
        hwm: int = 100_000,
        batch: int = 2_000,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        curve_server: CurveServer | None = None,
        curve_client: CurveClient | None = None,
        insecure_bind: bool = False,
        metrics: str | None = None,
    ) -> None:
        if not masters:
            raise ConfigError("the router needs at least one --master")
        names = [m.accounting for m in masters]
        if len(set(names)) != len(names):
            raise ConfigError(f"duplicate master accounting address in {names}")
        if shard_by not in SHARD_BY:
            raise ConfigError(f"--shard-by: {shard_by!r} is neither domain nor identifier")
        self.accounting = accounting
        self.control = control
        self.masters = list(masters)
        self.shard_by = shard_by
        self.ring = HashRing(names)
        self.batch = batch
        self.hwm = hwm
        self.ctx = context or zmq.Context.instance()
        self.frontend = self.ctx.socket(zmq.SUB)
        self.control_out = self.ctx.socket(zmq.PUB)
        self.upstreams: list[_Upstream] = []
        self.to_master: dict[str, zmq.Socket[bytes]] = {}
        self.to_fleet: zmq.Socket[bytes] | None = None  # shard_by identifier
        self._owners: dict[bytes, zmq.Socket[bytes]] = {}
        self._shard_topics: dict[bytes, tuple[bytes, ...]] = {}
        self.counters = Counters.of(len(self.masters))
        self.offers = Offers()
        self.forwarded = 0
        self.relayed = 0
        self.discarded = 0
        self.control_discarded = 0
        self.discard_log = RateLimitedLog(log, burst=10)
        self.control_log = RateLimitedLog(log, interval=60.0)
        self.curve_server = curve_server  # towards the gatekeepers
        self.curve_client = curve_client  # towards the masters
        self.insecure_bind = insecure_bind
        self.auth: AllowList | None = None
        self._watched: list[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]] = []  # (sock, monitor)
        self._redial_due: dict[tuple[int, str], float] = {}  # (watched, address) -> when
        self.handshake_log = RateLimitedLog(log, interval=60.0)
        self._stopping = asyncio.Event()
        self.metrics = metrics
        self.listener: ObserveServer | None = None
        self.bound = False

    def secure(self) -> None:
        """As the master's: protected mode, then CURVE towards the gatekeepers, before
        binding (the sockets towards the masters are secured as they are made)."""
        allowed = None
        if self.curve_server is not None:
            self.auth = self.curve_server.allow_list(self.ctx)
            allowed = len(self.auth.keys)
            for sock in (self.frontend, self.control_out):
                self.curve_server.secure(sock)
        level, line = bind_mode((self.accounting, self.control), allowed, self.insecure_bind)
        log.log(level, line)

    def _towards_master(self, kind: int, *addresses: str) -> zmq.Socket[bytes]:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 200)
        allow_ipv6(sock, *addresses)
        if kind == zmq.PUB:
            sock.setsockopt(zmq.SNDHWM, self.hwm)
        else:
            sock.setsockopt(zmq.RCVHWM, self.hwm)
            sock.subscribe(b"")
        if self.curve_client is not None:
            self.curve_client.secure(sock)
        if self.curve_client is not None or kind == zmq.SUB:  # (see _events)
            self._watched.append((sock, sock.get_monitor_socket(_WATCHED)))
        for address in addresses:
            sock.connect(address)
        return sock

    def bind(self) -> None:
        self.secure()
        for sock in (self.frontend, self.control_out):
            sock.setsockopt(zmq.LINGER, 200)
        self.frontend.setsockopt(zmq.RCVHWM, self.hwm)
        self.frontend.subscribe(b"")
        self.frontend.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        self.control_out.setsockopt(zmq.SNDHWM, self.hwm)
        allow_ipv6(self.frontend, self.accounting)
        allow_ipv6(self.control_out, self.control)
        self.frontend.bind(self.accounting)
        self.control_out.bind(self.control)
        if self.shard_by == "identifier":
            self.to_fleet = self._towards_master(zmq.PUB, *(m.accounting for m in self.masters))
        for i, m in enumerate(self.masters):
            if self.to_fleet is None:
                self.to_master[m.accounting] = self._towards_master(zmq.PUB, m.accounting)
            sub = self._towards_master(zmq.SUB, m.control)
            self.upstreams.append(_Upstream(i, m.control, sub))
        self.bound = True
        log.info(
            "router: accounting on %s, control on %s, sharding by %s over %d master(s): %s",
            self.accounting,
            self.control,
            self.shard_by,
            len(self.masters),
            ", ".join(f"{m.accounting}|{m.control}" for m in self.masters),
        )

    async def _redial(self) -> None:
        """Read the monitors of the sockets towards the masters (:meth:`_events`) and dial
        a master again ``REDIAL_S`` after a failed handshake (libzmq gives up)."""
        while True:
            await asyncio.sleep(0.25)
            for i in range(len(self._watched)):
                self._events(i)
            now = time.monotonic()
            for (i, address), when in list(self._redial_due.items()):
                if when <= now:
                    del self._redial_due[(i, address)]
                    sock = self._watched[i][0]
                    with contextlib.suppress(zmq.ZMQError):
                        sock.disconnect(address)
                    with contextlib.suppress(zmq.ZMQError):
                        sock.connect(address)

    def _events(self, i: int) -> None:
        """The events of watched socket ``i``: a failed handshake (logged, redialled), or
        a master's control connection lost, after which its counting starts again
        (:meth:`Counters.reconnected`: it restarted, or what it published meanwhile is
        unknown)."""
        sock, monitor = self._watched[i]
        while monitor.poll(0):
            message = parse_monitor_message(monitor.recv_multipart())
            address = message["endpoint"].decode("utf-8", "replace")
            if message["event"] == zmq.EVENT_DISCONNECTED:
                for up in self.upstreams:
                    if up.sock is sock:
                        self.counters.reconnected(up.index)
                continue
            self.handshake_log.warning(
                "handshake with master %s failed: does it hold "
                "--curve-server's key, and allow this router's "
                "key?",
                address,
                key=address,
            )
            self._redial_due.setdefault((i, address), time.monotonic() + REDIAL_S)

    def reload(self) -> None:
        """SIGHUP: read the allowed gatekeeper keys again (the masters and addresses need a
        restart)."""
        if self.auth is None:
            log.info("router: SIGHUP: no --curve-clients to reread (restart to apply changes)")
            return
        log.info(
            "control plane: CURVE, %d allowed gatekeeper key(s)",
            self.auth.reload(self.frontend, self.control_out),
        )

    def stats(self) -> dict[str, int]:
        denied = self.auth.denied if self.auth is not None else 0
        return {
            "forwarded": self.forwarded,
            "relayed": self.relayed,
            "discarded": self.discarded,
            "denied": denied,
            "control_lost": self.counters.lost,
        }

    def observe(self, address: str) -> ObserveServer:
        """/metrics (forwarded, relayed, discarded...), /healthz, /readyz (sockets bound)."""
        registry = CollectorRegistry()
        registry.register(CountersCollector(ROUTER, self.stats))
        readiness = Readiness({"bound": lambda: None if self.bound else "sockets not bound yet"})
        return serve(address, readiness, registry)

    def owner(self, domain_frame: bytes) -> zmq.Socket[bytes]:
        """The PUB towards the master owning a domain (its topic frame, NUL included; a
        shard topic counts as its domain's)."""
        sock = self._owners.get(domain_frame)
        if sock is None:
            if len(self._owners) >= OWNER_CACHE:
                self._owners.clear()
            domain = domain_frame[3:] if domain_frame[:2] == SHARD_PREFIX else domain_frame
            domain = domain[:-1] if domain.endswith(b"\0") else domain
            owner = self.ring.owner(domain)
            sock = self._owners[domain_frame] = self.to_master[owner]
        return sock

    def shard_topics(self, domain_frame: bytes) -> tuple[bytes, ...]:
        """A domain's 64 shard topics, by shard (memoised)."""
        topics = self._shard_topics.get(domain_frame)
        if topics is None:
            if len(self._shard_topics) >= OWNER_CACHE:
                self._shard_topics.clear()
            topics = self._shard_topics[domain_frame] = shard_topics(domain_frame)
        return topics

    def stop(self) -> None:
        self._stopping.set()

    async def run(self, *, handle_signals: bool = True) -> None:
        """Serve until ``stop``; with ``handle_signals`` SIGTERM/SIGINT call it (the
        ``smockron`` command leaves signals to smockron.runtime instead)."""
        loop = asyncio.get_running_loop()
        try:
            self.bind()
            if self.metrics:
                self.listener = self.observe(self.metrics)
        except BaseException:
            self.close()
            raise
        for sig in (signal.SIGTERM, signal.SIGINT):
            if handle_signals:
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, self.stop)
        # the frontend is waited on after every batch: watched for the router's life
        frontend = Readable(self.frontend, loop)
        by = self._by_identifier if self.to_fleet is not None else self._by_domain
        accounting = by(frontend)
        tasks = [
            asyncio.create_task(accounting),
            asyncio.create_task(self._publish_counts()),
            *(asyncio.create_task(self._control(up)) for up in self.upstreams),
        ]
        tasks.append(asyncio.create_task(self._redial()))
        try:
            await self._stopping.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            frontend.close()
            for sig in (signal.SIGTERM, signal.SIGINT) if handle_signals else ():
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.remove_signal_handler(sig)
            self.close()
            log.info(
                "router stopped: forwarded %d, relayed %d, discarded %d, denied %d, "
                "lost on the way from the masters %d",
                self.forwarded,
                self.relayed,
                self.discarded,
                self.auth.denied if self.auth is not None else 0,
                self.counters.lost,
            )

    def close(self) -> None:
        for sock, monitor in self._watched:
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
            monitor.close(0)
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        towards = [*self.to_master.values(), *(up.sock for up in self.upstreams)]
        if self.to_fleet is not None:
            towards.append(self.to_fleet)
        for sock in (self.frontend, self.control_out, *towards):
            sock.close()
        if self.auth is not None:
            self.auth.stop()

    def _unusable(self, frames: Sequence[bytes]) -> str | None:
        """Why no master could use this message, or None."""
        head = frames[0]
        if not head:
            return "without a domain"
        if frame_count(frames) > MAX_FRAMES:
            return f"over {MAX_FRAMES} frames"
        if head[:1] == b"\0" and head[:2] != SHARD_PREFIX and head.startswith(MASTERS_PREFIX):
            return "on a topic of the masters' own"
        return None

    async def _by_domain(self, frontend: Readable) -> None:
        while True:
            batch = drain(self.frontend, self.batch)
            if not batch:
                await frontend.wait(0.25)
                continue
            by_owner: dict[zmq.Socket[bytes], list[list[bytes]]] = {}
            for frames in batch:
                if (
                    not frames[0] or frames[0][0] == 0 or type(frames) is not list
                ) and self._unusable(frames):
                    self._discard(frames)
                    continue
                sock = self.owner(frames[0])
                group = by_owner.get(sock)
                if group is None:
                    group = by_owner[sock] = []
                group.append(frames)
            for sock, group in by_owner.items():
                self.forwarded += send_all(sock, group)
            await asyncio.sleep(0)

    async def _by_identifier(self, frontend: Readable) -> None:
        """Each message on its identifier's shard topic, all through one PUB connected to
        every master; RESYNCs (and messages on a shard topic already) as they came."""
        pub = self.to_fleet
        assert pub is not None
        crc32 = zlib.crc32
        mask = SHARDS - 1
        while True:
            batch = drain(self.frontend, self.batch)
            if not batch:
                await frontend.wait(0.25)
                continue
            out: list[list[bytes]] = []
            for frames in batch:
                head = frames[0]
                if (not head or head[0] == 0 or type(frames) is not list) and self._unusable(
                    frames
                ):
                    self._discard(frames)
                    continue
                if head[:2] == SHARD_PREFIX:
                    out.append(frames)
                elif len(frames) >= 3 and frames[1] != RESYNC:
                    frames[0] = self.shard_topics(head)[crc32(frames[2]) & mask]
                    out.append(frames)
                elif len(frames) >= 2 and frames[1] == RESYNC:
                    out.append(frames)
                else:
                    self._discard(frames, "without an identifier")
            self.forwarded += send_all(pub, out)
            await asyncio.sleep(0)

    def _discard(self, frames: Sequence[bytes], why: str | None = None) -> None:
        """Count and log a message no master could use (``%r`` escapes its bytes)."""
        self.discarded += 1
        why = why or self._unusable(frames) or "unusable"
        self.discard_log.warning(
            "discarded accounting message %s (%d frames): %r",
            why,
            frame_count(frames),
            [f[:40] for f in frames[:3]],
            key=why,
        )

    def _poke(self) -> None:
        """Let the PUB sockets take their new connections and subscriptions now.

        libzmq processes a socket's commands (a gatekeeper that connected, the topics it
        subscribed to) only when the socket's own thread calls into it; a quiet router
        would otherwise take a new gatekeeper's subscriptions only with the next message
        it sends, and that message (often the answer to the RESYNC the gatekeeper sent
        as it connected) would not reach it: it would ask again, for a second resync."""
        for sock in (self.control_out, self.to_fleet, *self.to_master.values()):
            if sock is not None:
                with contextlib.suppress(zmq.ZMQError):
                    sock.getsockopt(zmq.EVENTS)
