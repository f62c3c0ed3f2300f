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
from dataclasses import dataclass, field

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
from smockron.errors import ConfigError, ProtocolError
from smockron.master.fleet import Peer
from smockron.master.server import MAX_FRAME_BYTES, RULES_EVERY_S
from smockron.observe import CountersCollector, ObserveServer, Readiness, serve
from smockron.observe.layouts import ROUTER
from smockron.ratelog import RateLimitedLog
from smockron.wire.batchio import drain, send_all, wait_readable
from smockron.wire.codec import (
    DELAY_UNTIL,
    MAX_FRAMES,
    PUBLISHED,
    RESYNC,
    RESYNCSTART,
    RULES,
    RULES_TOPIC,
    decode_published,
    encode_published,
    frame_count,
)
from smockron.wire.fleet import SYNC_PREFIX

log = logging.getLogger("smockron.router")

OWNER_CACHE = 65_536
"""Domains whose owner (or shard topics) is memoised; a flood of random domains only
resets the cache."""
SHARD_BY = ("domain", "identifier")
MAX_DOMAINS = 10_000
"""Domains the router keeps publish counters and rules offers for (a gatekeeper takes
offers for as many)."""
OFFER_EVERY_S = 0.9 * RULES_EVERY_S
"""A domain's unchanged rules offer is relayed at most this often: about once per
master's period, whichever master sends it first (a little less than the period, so a
master's jitter does not skip one)."""
COUNTER_STALE_S = 5 * RULES_EVERY_S
"""A domain no master has counted for this long (removed by a reload) is no longer
counted by the router either."""
POKE_S = 0.05
"""How often the PUB sockets are poked (:meth:`Router._poke`)."""
MASTERS_PREFIX = b"\0smockron"
"""Topics of messages between masters (sync requests): never from a gatekeeper."""


MasterAddress = Peer
"""A master's accounting and control addresses: the fleet's :class:`Peer`, one type."""


@dataclass(slots=True)
class _Seen:
    """One master's counter for one domain, as the router last heard it."""

    published: int  # the master's count at its last heartbeat
    received: int  # what the router had received from it then
    lost: int = 0  # published by it, never received by the router (summed over heartbeats)


@dataclass(slots=True)
class Counters:
    """The router's publish counter per domain, from its masters' (pure: no sockets).

    The count of a domain is what the router relayed of its DELAY_UNTILs plus what the
    masters' counters show the router never received. Why not the sum of the masters'
    latest counts: a master's count runs ahead of its last heartbeat by what it has
    published since, which the router relays at once; a gatekeeper comparing the sum
    with what it received would take that for a loss whenever one master's heartbeat
    was older than another's at one counter and newer at the next. What the router
    counts instead is what it sent before it publishes the count, so a gatekeeper's
    difference is exactly what was lost: on the way from a master to the router (found
    at that master's next heartbeat: a master's heartbeat reaches the router after every
    DELAY_UNTIL it counts, on the same connection) or from the router to it.

    A master whose count went down restarted: its counting starts again from the new
    count, and the router's count goes on growing (a gatekeeper behind the router does
    not see masters restart; the RESYNC it needs then comes from the loss, if any, or
    from nothing: a restarted master has lost nothing the gatekeeper holds). A restarted
    router starts from zero, which a gatekeeper reads as a new master (it reconnected
    anyway, and asked for a resync).
    """

    received: list[dict[bytes, int]]
    """Per master, per domain topic (``domain\\0``): DELAY_UNTILs received (and relayed)."""
    seen: list[dict[bytes, _Seen]] = field(default_factory=list)
    heard: dict[bytes, float] = field(default_factory=dict)
    """Domains (topic frame) a master counted, and when last (monotonic)."""
    lost: int = 0

    @classmethod
    def of(cls, masters: int) -> Counters:
        return cls([{} for _ in range(masters)], [{} for _ in range(masters)])

    def delivered(self, master: int, counts: dict[bytes, int]) -> None:
        """DELAY_UNTILs of ``master`` received and relayed, per domain topic."""
        received = self.received[master]
        for name, n in counts.items():
            if name in received:
                received[name] += n
            elif len(received) < MAX_DOMAINS:
                received[name] = n

    def heartbeat(self, master: int, domain_topic: bytes, published: int, now: float) -> int:
        """A master's counter for a domain; how many of its DELAY_UNTILs never reached the
        router since its previous counter (0 at the first, and after a restart)."""
        seen = self.seen[master]
        got = self.received[master].get(domain_topic, 0)
        last = seen.get(domain_topic)
        if last is None:
            if len(seen) >= MAX_DOMAINS or (domain_topic not in self.heard
                                            and len(self.heard) >= MAX_DOMAINS):  # fmt: skip
                return 0
            seen[domain_topic] = _Seen(published, got)
            self.heard[domain_topic] = now
            return 0
        self.heard[domain_topic] = now
        lost = 0
        if published >= last.published:  # else a restarted master: counting starts again
            lost = max(0, (published - last.published) - (got - last.received))
        last.published, last.received = published, got
        last.lost += lost
        self.lost += lost
        return lost

    def count(self, domain_topic: bytes) -> int:
        """The router's counter of a domain: relayed, plus lost on the way to the router."""
        total = 0
        for master, received in enumerate(self.received):
            total += received.get(domain_topic, 0)
            seen = self.seen[master].get(domain_topic)
            if seen is not None:
                total += seen.lost
        return total

    def current(self, now: float) -> list[tuple[bytes, int]]:
        """``(domain, count)`` of every domain a master counted lately (stale ones go)."""
        out = []
        for name, when in list(self.heard.items()):
            if now - when > COUNTER_STALE_S:
                del self.heard[name]
                continue
            out.append((name[:-1], self.count(name)))
        return sorted(out)


@dataclass(slots=True)
class Offers:
    """Which rules offers to relay: a domain's offer when it changed, or when the last
    one relayed is ``OFFER_EVERY_S`` old (pure: no sockets)."""

    last: dict[bytes, tuple[tuple[bytes, ...], float, int]] = field(default_factory=dict)
    """Domain -> (frames, when relayed, from which master)."""
    disagree: int = 0

    def fresh(self, frames: Sequence[bytes], master: int, now: float) -> bool:
        key = tuple(frames)
        domain = frames[2] if len(frames) > 2 else b""
        last = self.last.get(domain)
        if last is not None and last[0] == key and now - last[1] < OFFER_EVERY_S:
            return False
        if last is None and len(self.last) >= MAX_DOMAINS:
            return True  # relayed, not remembered
        if last is not None and last[0] != key and last[2] != master and now - last[1] < 2.0:
            self.disagree += 1
        self.last[domain] = (key, now, master)
        return True


@dataclass(slots=True)
class _Upstream:
    """One master's control connection."""

    index: int
    address: str
    sock: zmq.Socket[bytes]
    held: list[bytes] | None = None
    """A rules offer not relayed (a duplicate), kept while it is the last message read:
    relayed after all if a RESYNCSTART follows it (the master sends the offer right
    before a resync's answer, for a gatekeeper that has just connected)."""


class Router:
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
            self._watch(sock)
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

    def _watch(self, sock: zmq.Socket[bytes]) -> None:
        """CURVE towards the masters, and a monitor of failed handshakes (see _redial)."""
        assert self.curve_client is not None
        self.curve_client.secure(sock)
        self._watched.append((sock, sock.get_monitor_socket(HANDSHAKE_FAILED)))

    async def _redial(self) -> None:
        """Dial a master again ``REDIAL_S`` after a failed handshake (libzmq gives up)."""
        due: dict[tuple[int, str], float] = {}
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            for i, (_sock, monitor) in enumerate(self._watched):
                while monitor.poll(0):
                    endpoint = parse_monitor_message(monitor.recv_multipart())["endpoint"]
                    address = endpoint.decode("utf-8", "replace")
                    self.handshake_log.warning("handshake with master %s failed: does it "
                                               "hold --curve-server's key, and allow this "
                                               "router's key?", address, key=address)  # fmt: skip
                    due.setdefault((i, address), now + REDIAL_S)
            for (i, address), when in list(due.items()):
                if when <= now:
                    del due[(i, address)]
                    sock = self._watched[i][0]
                    with contextlib.suppress(zmq.ZMQError):
                        sock.disconnect(address)
                    with contextlib.suppress(zmq.ZMQError):
                        sock.connect(address)

    def reload(self) -> None:
        """SIGHUP: read the allowed gatekeeper keys again (the masters and addresses need a
        restart)."""
        if self.auth is None:
            log.info("router: SIGHUP: no --curve-clients to reread (restart to apply changes)")
            return
        log.info("control plane: CURVE, %d allowed gatekeeper key(s)",
                 self.auth.reload(self.frontend, self.control_out))  # fmt: skip

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
        accounting = self._by_identifier() if self.to_fleet is not None else self._by_domain()
        tasks = [asyncio.create_task(accounting), asyncio.create_task(self._publish_counts()),
                 *(asyncio.create_task(self._control(up)) for up in self.upstreams)]  # fmt: skip
        if self._watched:
            tasks.append(asyncio.create_task(self._redial()))
        try:
            await self._stopping.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
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

    async def _by_domain(self) -> None:
        while True:
            batch = drain(self.frontend, self.batch)
            if not batch:
                await wait_readable(self.frontend, 0.25)
                continue
            by_owner: dict[zmq.Socket[bytes], list[list[bytes]]] = {}
            for frames in batch:
                if (not frames[0] or frames[0][0] == 0
                        or type(frames) is not list) and self._unusable(frames):  # fmt: skip
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

    async def _by_identifier(self) -> None:
        """Each message on its identifier's shard topic, all through one PUB connected to
        every master; RESYNCs (and messages on a shard topic already) as they came."""
        pub = self.to_fleet
        assert pub is not None
        crc32 = zlib.crc32
        mask = SHARDS - 1
        while True:
            batch = drain(self.frontend, self.batch)
            if not batch:
                await wait_readable(self.frontend, 0.25)
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

    async def _control(self, up: _Upstream) -> None:
        """One master's control: relayed in order, but for its publish counters (taken
        into the router's own) and the rules offers other masters sent already."""
        counts: dict[bytes, int] = {}
        while True:
            batch = drain(up.sock, self.batch)
            if not batch:
                await wait_readable(up.sock, 0.25)
                continue
            now = time.monotonic()
            relay: list[list[bytes]] = []
            for frames in batch:
                head = frames[0]
                second = frames[1] if len(frames) > 1 else b""
                if type(frames) is not list:  # more frames than any message: not ours
                    self.control_discarded += 1
                    self.control_log.warning("master %s sent a control message of %d frames: "
                                             "not relayed", up.address, frame_count(frames),
                                             key="frames")  # fmt: skip
                elif second == DELAY_UNTIL and head[:1] != b"\0":
                    counts[head] = counts.get(head, 0) + 1
                    relay.append(frames)
                elif head[:1] == b"\0" and head.startswith(SYNC_PREFIX):
                    continue  # a master's answer to a peer's warm start: not for gatekeepers
                elif head == RULES_TOPIC and second == PUBLISHED:
                    if counts:  # what it counts came before it: counted first
                        self.counters.delivered(up.index, counts)
                        counts.clear()
                    self._heartbeat(up, frames, now)
                    continue  # keeps up.held: the counters go out with the offers
                elif head == RULES_TOPIC and second == RULES:
                    if self.offers.fresh(frames, up.index, now):
                        relay.append(frames)
                        up.held = None
                    else:
                        up.held = frames
                    continue
                else:
                    if second == RESYNCSTART and up.held is not None:
                        relay.append(up.held)
                    relay.append(frames)
                up.held = None
            if counts:  # counted before they are sent: the counter goes out after them
                self.counters.delivered(up.index, counts)
                counts.clear()
            if relay:
                self.relayed += send_all(self.control_out, relay)
            await asyncio.sleep(0)

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

    def _heartbeat(self, up: _Upstream, frames: Sequence[bytes], now: float) -> None:
        try:
            domain, published = decode_published(frames)
        except ProtocolError as exc:
            self.control_discarded += 1
            self.control_log.warning("master %s sent a malformed publish counter: %s",
                                     up.address, exc, key="counter")  # fmt: skip
            return
        lost = self.counters.heartbeat(up.index, domain + b"\0", published, now)
        if lost:
            self.control_log.warning(
                "lost %d DELAY_UNTIL(s) for %r from master %s (its queue towards the "
                "router was full): the router's counter shows them to the gatekeepers, "
                "which ask for a resync", lost, domain[:64], up.address, key="lost",
            )  # fmt: skip

    async def _publish_counts(self) -> None:
        """The router's publish counter of each domain, once a period; between two,
        the PUB sockets are poked (see :meth:`_poke`)."""
        while True:
            for _ in range(max(1, round(RULES_EVERY_S / POKE_S))):
                await asyncio.sleep(POKE_S)
                self._poke()
            if self.offers.disagree:
                self.control_log.warning("the masters offer different rules for a domain "
                                         "(%d times): run them with the same rules",
                                         self.offers.disagree, key="disagree")  # fmt: skip
                self.offers.disagree = 0
            counts = [encode_published(d, n) for d, n in self.counters.current(time.monotonic())]
            if counts:
                with contextlib.suppress(zmq.ZMQError):
                    send_all(self.control_out, counts)
