"""A gatekeeper's connections to its master, and what comes over them.

The sockets (a PUB connected to the master's accounting address, a SUB to its control
address), their monitors (connected, disconnected, a failed CURVE handshake and the
redial after it), and the control messages: DELAY_UNTILs fed to the decider, rules
offers, the master's publish counters (loss detection) and the RESYNCs asked when
verdicts were lost or the connection came back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Callable, Iterable
from itertools import groupby
from typing import Any, Final, TypeVar, cast

import zmq
from zmq.utils.monitor import parse_monitor_message

from smockron.core.rules import ALGORITHMS
from smockron.curve import HANDSHAKE_FAILED, REDIAL_S, CurveClient, allow_ipv6, keep_alive
from smockron.errors import ConfigError, ProtocolError
from smockron.gatekeeper._decider import Counters, Decider
from smockron.gatekeeper._firstline import Line, describe_line
from smockron.observe.heard import MasterWatch
from smockron.ratelog import RateLimitedLog
from smockron.settings import parse_master
from smockron.wire.batchio import send_all
from smockron.wire.codec import (
    DELAY_UNTIL,
    PUBLISHED,
    RESYNCDONE,
    RESYNCSTART,
    RULES_TOPIC,
    decode_control,
    decode_published,
    decode_rules,
    encode_resync,
    topic,
)
from smockron.wire.control import ControlBatch, ControlRecord
from smockron.wire.fleet import encode_private_resync, resync_reply

log = logging.getLogger("smockron.gatekeeper")
T = TypeVar("T")

CONTROL_BATCH: Final = 4096
"""Control messages drained in one call."""
CONTROL_SLICE: Final = 256
"""...and applied between two turns of the loop (or lock hand-overs)."""
CONTROL_HWM: Final = 100_000
"""Control messages queued for the gatekeeper before ZeroMQ drops (the master's HWM too)."""
CONTROL_BATCHES: Final = 64
"""Batches the threaded reader drains before it sweeps and checks for stop."""
_MONITOR_EVENTS: Final = (
    zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | HANDSHAKE_FAILED
)
"""A connection counts (and is logged) once its handshake succeeded: a TCP connection
whose handshake fails (no keys here, a wrong key) is not a connection to the master."""
UNPROVEN_S: Final = 0.5
"""libzmq reports no handshake with a peer speaking ZMTP 1.0/2.0 (ZeroMQ 2 and 3, as an
original Smockron master may): without CURVE, a connection that has not failed this long
after it opened counts too. With CURVE only a succeeded handshake counts."""
AUTH_STALE_S: Final = 10.0
"""A failed handshake makes the gatekeeper not ready until one succeeds, or for this long
after the last failure (the master may have gone away meanwhile: then the silence says so)."""
_MECHANISM_MISMATCH: Final = int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
CLOSE_LINGER_MS: Final = 1000
"""At close, the accounting still queued gets this long to reach a connected master
(with none connected it is dropped at once, as it would be counted had it been sent)."""
EARLY_SUBSCRIPTION_S: Final = 1.0
"""A master's subscription read before its connection's handshake event counts for a
handshake that follows within this long."""
_SUBSCRIPTIONS_READ: Final = 1024
"""Subscription messages read from the accounting socket in one call."""
_ENDPOINT: Final = re.compile(r"^(tcp|ipc|inproc|pgm|epgm|ws|wss|vmci)://\S+$")
MAX_LINES: Final = 10_000
"""Domains a gatekeeper takes rules offers for: whatever publishes on the control port
cannot make it remember unbounded domains."""
RESYNC_FIRST_RETRY_S: Final = 0.05
"""The first RESYNC after a (re)connection is often lost: sent once the accounting
connection is up, it can reach the PUB socket before the master's subscription does,
and a PUB drops what no one subscribes to. So the first retry comes after this long
(in practice at the next tick, within 0.1 s)..."""
RESYNC_RETRY_S: Final = 0.25
"""...and the next ones, while no RESYNCSTART answers, after this long..."""
RESYNC_ATTEMPTS: Final = 8
"""...at most this many times: an original master, which never answers, is not asked
without end (it logs each RESYNC as an accounting error)."""


def _batch_io_thread(ctx: zmq.Context[Any]) -> None:
    """Run the context's I/O thread (not yet started) under ``SCHED_BATCH`` where there is one.

    libzmq flushes its pipe to the I/O thread after every message, waking that thread
    whenever it has drained the pipe; a normal thread woken on the core of a busy event
    loop (or request thread) preempts it, so each accounting message cost a context
    switch pair and the I/O thread's work was done one message at a time. A batch thread
    does not preempt on wake-up: sharing a core, it runs at the next tick or sleep,
    draining many messages at once; on an idle core it runs at once, as before. Best
    effort: without it the gatekeeper works the same, only at a higher cost.
    """
    policy = getattr(os, "SCHED_BATCH", None)
    option = getattr(zmq, "THREAD_SCHED_POLICY", None)
    if policy is None or option is None:
        return
    with contextlib.suppress(zmq.ZMQError):
        ctx.set(option, policy)


def now_ms() -> int:
    """Wall-clock milliseconds since 1970: the protocol's time base."""
    return time.time_ns() // 1_000_000


def _as_bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


Master = tuple[str | None, str | None]
"""A master's accounting and control addresses."""

PRIVATE_ATTEMPTS: Final = 4
"""RESYNCs sent with a reply topic before falling back to bare ones (a master that does
not know private answers: an original one, or an older smockron)."""


class _Control:
    """One master's control connection: whether it is up, and its loss detection."""

    __slots__ = ("address", "heartbeat", "index", "received", "replies", "up")

    def __init__(self, index: int, address: str | None) -> None:
        self.index = index
        self.address = address
        self.up = 0
        self.received: dict[bytes, int] = {}
        """DELAY_UNTILs received per domain we serve (bounded by ``MAX_LINES``)."""
        self.heartbeat: dict[bytes, tuple[int, int]] = {}
        """Per domain, the master's publish count and our received count at its last
        heartbeat: the next one's difference in both is what was lost meanwhile."""
        self.replies: dict[bytes, bytes] = {}
        """Our private RESYNC reply topics on this connection -> their domain."""


class _Link:
    """The connection and control half of a gatekeeper (``_base._GatekeeperBase``).

    With several masters (a fleet), one PUB is connected to every master's accounting
    address and each message goes on its identifier's shard topic: ZeroMQ's subscription
    filtering hands it to the masters that hold the shard. Each master's control comes
    on a SUB of its own (:class:`_Control`), so what it published, what we lost of it and
    its RESYNC answers are counted per master; a verdict from any of them is obeyed (the
    delay table keeps the latest time)."""

    decider: Decider
    counters: Counters
    master_rules: bool
    sndhwm: int

    def _init_link(
        self,
        accounting: str | None,
        control: str | None,
        domains: Iterable[bytes | str] | None,
        curve: CurveClient | None,
        masters: Iterable[Master | str] = (),
    ) -> None:
        fleet = [parse_master(m) if isinstance(m, str) else m for m in masters]
        self.masters: list[Master] = fleet or [(accounting, control)]
        for acc, ctl in self.masters:
            for name, address in (("accounting", acc), ("control", ctl)):
                if address and _ENDPOINT.match(address) is None:
                    raise ConfigError(
                        f"bad {name} address {address!r}: expected a ZeroMQ endpoint such as "
                        "tcp://127.0.0.1:10004"
                    )
        self.accounting, self.control = self.masters[0]
        self.sharded = len(self.masters) > 1
        """A fleet: accounting goes on shard topics (smockron.core.shards)."""
        self.curve = curve
        self._monitor_events = _MONITOR_EVENTS
        # None: subscribe to every domain (used when the domain comes from a callable)
        self.domains = None if domains is None else frozenset(_as_bytes(d) for d in domains)
        self._control_topics = {topic(d): d for d in self.domains or ()}
        """Topic frame -> domain: the DELAY_UNTILs ``drain_control`` decodes for us (with
        no domains given, none: everything takes the codec's way). Our private RESYNC
        reply topics are in it too, for their domain."""
        self._controls = [_Control(k, ctl) for k, (_acc, ctl) in enumerate(self.masters)]
        token = os.urandom(8).hex().encode()
        self._reply_of: dict[tuple[int, bytes], bytes] = {}
        for link in self._controls:
            for i, domain in enumerate(sorted(self.domains or ())):
                reply = resync_reply(b"%s.%d.%d" % (token, link.index, i))
                link.replies[reply] = domain
                self._reply_of[link.index, domain] = reply
                self._control_topics[reply] = domain
        self._peers = 0  # accounting connections up, from the PUB socket's monitor
        self._acc_up = [0] * len(self.masters)  # ...per master, handshake done
        self._awaiting: set[int] = set()
        """Masters whose accounting handshake succeeded and whose subscription has not
        arrived yet: a PUB drops what no one subscribes to, silently, so what is sent
        meanwhile would vanish; it is counted as dropped instead."""
        self._subscribed_early = 0.0  # when a subscription came before its handshake event
        self._unproven: dict[tuple[bool, int], float] = {}
        """(control?, master) -> when its TCP connection opened, handshake not yet done."""
        self._auth: dict[tuple[bool, int], tuple[int, int, float]] = {}
        """(control?, master) -> the last failed handshake (event, value, monotonic time),
        until one succeeds."""
        self._control_peers = 0  # control connections up, from the SUB socket's monitor
        self._pub: zmq.Socket[bytes] | None = None
        self._malformed_log = RateLimitedLog(log)
        self._handshake_log = RateLimitedLog(log, interval=60.0)
        self._redial: dict[tuple[bool, int], float] = {}
        """(control?, master) -> when to dial it again (monotonic)."""
        self.handshakes_failed = 0
        self.watch = MasterWatch(control, now_ms())  # readiness, and the silent-master warning
        self._resync: dict[tuple[int, bytes], tuple[int, float]] = {}
        """(master, domain) to ask a RESYNC for: attempts made, and when to try again
        (monotonic)."""
        self.resyncs_requested = 0
        self.resyncs_done = 0

    @property
    def control_connected(self) -> bool:
        """Whether the control socket is connected: verdicts can reach this gatekeeper."""
        return self._control_peers > 0

    def master_problem(self, now: int | None = None) -> str | None:
        """Why this gatekeeper does not hear from its master, or None (readiness)."""
        return self.auth_problem() or self.watch.problem(
            now_ms() if now is None else now, self.control_connected
        )

    def auth_problem(self) -> str | None:
        """Why this gatekeeper cannot authenticate to a master (its last handshake failed
        and none succeeded since), or None."""
        now = time.monotonic()
        for (control, link), (event, value, when) in sorted(self._auth.items()):
            up = self._controls[link].up if control else self._acc_up[link]
            if up or now - when > AUTH_STALE_S:
                continue
            acc, ctl = self.masters[link]
            return (f"cannot authenticate to the master at {ctl if control else acc}: "
                    f"{self._auth_reason(event, value)}")  # fmt: skip
        return None

    def _auth_reason(self, event: int, value: int) -> str:
        """What a failed handshake's monitor event tells of its cause."""
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return (f"the master refused this gatekeeper's key (ZAP status {value}): add "
                    "its public key to the master's --curve-clients directory and send the "
                    "master SIGHUP")  # fmt: skip
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == _MECHANISM_MISMATCH:
            if self.curve is None:
                return ("the master requires CURVE and this gatekeeper has no keys: give it "
                        "--curve-secret and --curve-server")  # fmt: skip
            return ("this gatekeeper uses CURVE and the master does not: give the master "
                    "--curve-secret and --curve-clients, or this gatekeeper no keys")  # fmt: skip
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            return (f"ZeroMQ protocol error {value:#x} in the handshake: is a smockron "
                    "master listening there?")  # fmt: skip
        if self.curve is not None:
            return ("the master closed the connection during the CURVE handshake: the key "
                    "pinned with --curve-server is not the key of the master at that "
                    "address (or that is not a CURVE master)")  # fmt: skip
        return ("the master closed the connection during the handshake: it likely requires "
                "CURVE and this gatekeeper has no keys (give it --curve-secret and "
                "--curve-server), or that is no ZeroMQ master")  # fmt: skip

    def _watch_master(self, now: int) -> None:
        """One loud line when the master stays silent (then again at most every minute);
        a failed authentication has its own (:meth:`_handshake_failed`)."""
        if self.auth_problem() is not None:
            return
        message = self.watch.warning(now, self.control_connected)
        if message is not None:
            log.warning("%s", message)

    @property
    def master_connected(self) -> bool:
        """Whether the accounting socket currently has a connection to a master."""
        return self._peers > 0

    def _apply_control(self, frames: list[bytes], now: int, link: int = 0) -> None:
        """Apply one control message; malformed ones are counted and logged, never raised."""
        if frames and frames[0] == RULES_TOPIC:
            if len(frames) > 1 and frames[1] == PUBLISHED:
                self._apply_published(frames, link)
            else:
                self._apply_rules(frames)
            return
        private = self._controls[link].replies.get(frames[0]) if frames else None
        if private is not None:  # our private RESYNC's answer: as on the domain's topic
            frames = [topic(private), *frames[1:]]
        control = self._decoded(decode_control, frames, "control message")
        ours = control is not None and (self.domains is None or control.domain in self.domains)
        if ours and control is not None and control.command == DELAY_UNTIL:
            self._apply_delays([(control.domain, control.identifier, control.until_ms)], now,
                               link)  # fmt: skip
            return
        self.counters.control_received += 1
        if control is None:
            return
        if not ours:
            self.counters.control_ignored += 1
            return
        # RESYNCSTART or RESYNCDONE
        self._resync_mark(control.domain, control.command, link, private is not None)

    def _apply_batch(self, batch: ControlBatch[bytes], now: int, link: int = 0) -> None:
        """Apply messages as ``wire.control.drain_control`` gives them, in order: runs of
        DELAY_UNTILs for our domains already decoded (tuples) in one call each, anything
        else (raw frames) one at a time."""
        for kind, run in groupby(batch, type):
            if kind is tuple:
                self._apply_delays(cast("list[ControlRecord[bytes]]", list(run)), now, link)
            else:
                for frames in run:
                    self._apply_control(cast("list[bytes]", frames), now, link)

    def _apply_delays(self, records: list[ControlRecord[bytes]], now: int, link: int = 0) -> None:
        """DELAY_UNTILs ``(domain, identifier, until_ms)`` for domains we serve (decoded,
        checked): counted per domain (loss detection), then remembered."""
        self.counters.control_received += len(records)
        table = self.decider.table
        refused, evicted = table.refused, table.evicted
        counts: dict[bytes, int] = {}
        self.decider.control_many(records, now, counts)
        received = self._controls[link].received
        for domain, count in counts.items():
            if domain in received:
                received[domain] += count
            elif len(received) < MAX_LINES:
                received[domain] = count
        if table.refused != refused:
            until_ms, domain, identifier = next(
                (u, d, i) for d, i, u in records if u - now > table.max_ahead_ms
            )
            self._malformed_log.warning(
                "refusing DELAY_UNTIL %d for %r/%r: more than %d ms ahead",
                until_ms, domain[:64], identifier[:64], table.max_ahead_ms,
            )  # fmt: skip
        elif table.evicted != evicted:
            self._malformed_log.warning(
                "delay table full (%d entries): evicted the %d expiring soonest",
                table.max_entries, table.evicted - evicted,
            )  # fmt: skip

    def _resync_mark(self, domain: bytes, command: bytes, link: int, private: bool) -> None:
        """A master answers a RESYNC: it started (stop asking it), or it is done. A
        private answer is not in the master's publish count: its heartbeat baseline
        starts again."""
        if command == RESYNCSTART:
            self._resync.pop((link, domain), None)
            if private:
                self._controls[link].heartbeat.pop(domain, None)
        elif command == RESYNCDONE:
            self.resyncs_done += 1

    def _apply_published(self, frames: list[bytes], link: int = 0) -> None:
        """The master's heartbeat: how many DELAY_UNTILs it published for a domain. What
        it published since the last heartbeat and we did not receive was lost (at a
        high-water mark): counted, and the domain's live verdicts asked for again."""
        heartbeat = self._decoded(decode_published, frames, "publish counter")
        if heartbeat is None:
            return
        domain, published = heartbeat
        if self.domains is not None and domain not in self.domains:
            return
        control = self._controls[link]
        received = control.received.get(domain, 0)
        last = control.heartbeat.get(domain)
        if last is None and len(control.heartbeat) >= MAX_LINES:
            return
        control.heartbeat[domain] = (published, received)
        if last is None:  # first heartbeat since (re)connecting: our baseline
            if self.domains is None:  # subscribed to everything: domains named here
                self._want_resync((domain,), link)
            return
        if published < last[0]:  # a new master: counting starts again
            return
        lost = (published - last[0]) - (received - last[1])
        if lost > 0:
            self.counters.control_lost += lost
            self._malformed_log.warning(
                "lost %d DELAY_UNTIL(s) for %r (published %d, received %d since the last "
                "heartbeat): asking the master to resync", lost, domain[:64],
                published - last[0], received - last[1],
            )  # fmt: skip
            self._want_resync((domain,), link)

    def _want_resync(self, domains: Iterable[bytes], link: int) -> None:
        """Ask master ``link`` for these domains' live verdicts (:meth:`_send_resyncs`)."""
        for domain in domains:
            key = (link, domain)
            if key not in self._resync and len(self._resync) < MAX_LINES:
                self._resync[key] = (0, 0.0)

    def _send_resyncs(self) -> None:
        """Send the RESYNCs due, once the accounting socket is connected; again after
        ``RESYNC_FIRST_RETRY_S``, then every ``RESYNC_RETRY_S`` until the master answers,
        ``RESYNC_ATTEMPTS`` times at most."""
        pub = self._pub
        if not self._resync or pub is None or self._peers <= 0:
            return
        now = time.monotonic()
        bare: set[bytes] = set()  # one bare RESYNC reaches every master
        for (link, domain), (attempts, due) in list(self._resync.items()):
            if due > now:
                continue
            if attempts >= RESYNC_ATTEMPTS:
                del self._resync[link, domain]
                self._malformed_log.warning("no answer to RESYNC for %r from %s: the master "
                                            "may not support it", domain[:64],
                                            self.masters[link][1])  # fmt: skip
                continue
            retry = RESYNC_FIRST_RETRY_S if attempts == 0 else RESYNC_RETRY_S
            self._resync[link, domain] = (attempts + 1, now + retry)
            reply = self._reply_of.get((link, domain))
            if reply is None or attempts >= PRIVATE_ATTEMPTS:
                if domain in bare:
                    continue
                bare.add(domain)
                message = encode_resync(domain)
            else:
                message = encode_private_resync(topic(domain), reply)
            self.resyncs_requested += 1
            with contextlib.suppress(zmq.ZMQError):
                send_all(pub, [message])

    def _decoded(
        self, decode: Callable[[list[bytes]], T], frames: list[bytes], what: str
    ) -> T | None:
        """``decode(frames)``, or None for a malformed message (counted, logged)."""
        try:
            return decode(frames)
        except ProtocolError as exc:
            self.counters.control_malformed += 1
            self._malformed_log.warning("ignoring malformed %s: %s", what, exc)
            return None

    def _apply_rules(self, frames: list[bytes]) -> None:
        """The master's offer of a domain's rules: they replace the configured ones."""
        self.counters.rules_received += 1
        offer = self._decoded(decode_rules, frames, "rules offer")
        if offer is None:
            return
        if not self.master_rules or (self.domains is not None and offer.domain not in self.domains):
            return
        if offer.domain not in self.decider.lines and len(self.decider.lines) >= MAX_LINES:
            self._malformed_log.warning("ignoring rules offer for %r: %d domains have rules "
                                        "already", offer.domain[:64], MAX_LINES)  # fmt: skip
            return
        if offer.algorithm not in ALGORITHMS:
            self._malformed_log.warning("ignoring rules offer with unknown algorithm %r for %r",
                                        offer.algorithm, offer.domain)  # fmt: skip
            return
        self._set_line(offer.domain, Line.of(offer.algorithm, offer.rules))

    def _set_line(self, domain: bytes, line: Line | None) -> None:
        if self.decider.set_line(domain, line):
            log.info("first line for %r: %s", domain.decode("utf-8", "replace"),
                     describe_line(line))  # fmt: skip

    def _apply_monitor(self, frames: list[bytes], control: bool = False, link: int = 0) -> None:
        """A connection event of the accounting socket, or (``control``) of master
        ``link``'s control one. A connection counts once its handshake succeeded
        (``UNPROVEN_S``): one whose handshake fails is neither counted nor logged."""
        try:
            message = parse_monitor_message(frames)
            event, value = message["event"], int(message["value"])
        except Exception:  # monitor frames come from libzmq, but never let them kill us
            return
        if not control:  # one PUB for every master: the event names the endpoint
            link = self._accounting_index(message.get("endpoint"))
        key = (control, link)
        if event & HANDSHAKE_FAILED:
            self._unproven.pop(key, None)
            self._handshake_failed(control, link, event, value)
        elif event == zmq.EVENT_CONNECTED:
            self._unproven[key] = time.monotonic()
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            if self._unproven.pop(key, None) is not None or self.curve is not None:
                self._connection_up(control, link)
        elif event == zmq.EVENT_DISCONNECTED and self._unproven.pop(key, None) is None:
            self._connection_down(control, link)  # (one that never counted: not logged)

    def _prove_connections(self) -> None:
        """Without CURVE, count the connections open ``UNPROVEN_S`` with no failure
        (a ZMTP 1.0/2.0 master reports no handshake)."""
        if self.curve is not None:
            return
        now = time.monotonic()
        for key, opened in list(self._unproven.items()):
            if now - opened >= UNPROVEN_S:
                del self._unproven[key]
                self._connection_up(*key)

    def _connection_up(self, control: bool, link: int) -> None:
        self._auth.pop((control, link), None)
        if control:
            self._control_event(zmq.EVENT_CONNECTED, link)
            return
        self._acc_up[link] += 1
        if time.monotonic() - self._subscribed_early <= EARLY_SUBSCRIPTION_S:
            self._subscribed_early = 0.0
            self._accounting_ready(link)
        else:  # sent to once its master's subscription arrived (_apply_subscriptions)
            self._awaiting.add(link)

    def _accounting_ready(self, link: int) -> None:
        self._peers += 1
        log.info("accounting connected to %s", self.masters[link][0])

    def _read_subscriptions(self) -> None:
        """Read the masters' subscriptions off the accounting socket (an XPUB)."""
        pub = self._pub
        if pub is None:
            return
        messages: list[bytes] = []
        with contextlib.suppress(zmq.ZMQError):
            while len(messages) < _SUBSCRIPTIONS_READ:
                messages.append(pub.recv(zmq.NOBLOCK))
        if any(m[:1] == b"\x01" for m in messages):
            self._apply_subscriptions()

    def _apply_subscriptions(self) -> None:
        """A master subscribed: the connections waiting for it count from now on (which
        master's it is the socket does not say: each waiting one)."""
        if not self._awaiting:
            self._subscribed_early = time.monotonic()
            return
        for link in sorted(self._awaiting):
            self._accounting_ready(link)
        self._awaiting.clear()

    def _connection_down(self, control: bool, link: int) -> None:
        if control:
            if self._controls[link].up:
                self._control_event(zmq.EVENT_DISCONNECTED, link)
            return
        if not self._acc_up[link]:
            return
        self._acc_up[link] -= 1
        if link in self._awaiting:  # never counted as connected: not logged either
            self._awaiting.discard(link)
            return
        self._peers = max(0, self._peers - 1)
        acc = self.masters[link][0]
        if self._peers:
            log.warning("accounting disconnected from %s: the other masters hold its "
                        "share", acc)  # fmt: skip
        else:
            log.warning("accounting disconnected from %s: failing open", acc)

    def _control_event(self, event: int, link: int) -> None:
        control = self._controls[link]
        if event == zmq.EVENT_CONNECTED:
            control.up += 1
            self._control_peers += 1
            self.watch.heard(now_ms())
            log.info("control connected to %s", control.address)
            control.heartbeat.clear()  # (re)connected: what we missed is unknown...
            self._want_resync(self.domains or (), link)  # ...so ask for every live verdict
        elif event == zmq.EVENT_DISCONNECTED:
            control.up = max(0, control.up - 1)
            self._control_peers = max(0, self._control_peers - 1)
            log.warning("control disconnected from %s: no verdicts from that master until "
                        "it is back", control.address)  # fmt: skip

    def _accounting_index(self, endpoint: object) -> int:
        """Which master an accounting socket event is about (by its endpoint)."""
        name = endpoint.decode("utf-8", "replace") if isinstance(endpoint, bytes) else endpoint
        for k, (acc, _ctl) in enumerate(self.masters):
            if acc == name:
                return k
        return 0

    def _handshake_failed(self, control: bool, link: int, event: int, value: int) -> None:
        """Counted, remembered (readiness) and said: one warning per master and minute,
        however fast libzmq redials."""
        self.handshakes_failed += 1
        self._auth[control, link] = (event, value, time.monotonic())
        acc, ctl = self.masters[link]
        self._handshake_log.warning("cannot authenticate to the master at %s: %s; failing "
                                    "open meanwhile", ctl if control else acc,
                                    self._auth_reason(event, value), key=f"auth{link}")  # fmt: skip
        self._redial.setdefault((control, link), time.monotonic() + REDIAL_S)

    def _control_socket(self, link: int = 0) -> zmq.Socket[Any] | None:
        """Subclass hook: master ``link``'s control SUB socket, once made."""
        return None

    def _dial_again(self) -> None:
        """Reconnect the sockets whose handshake failed ``REDIAL_S`` ago."""
        now = time.monotonic()
        for (control, link), due in list(self._redial.items()):
            if due > now:
                continue
            del self._redial[control, link]
            sock = self._control_socket(link) if control else self._pub
            acc, ctl = self.masters[link]
            endpoint = ctl if control else acc
            if sock is None or not endpoint:
                continue
            with contextlib.suppress(zmq.ZMQError):
                sock.disconnect(endpoint)
            with contextlib.suppress(zmq.ZMQError):
                sock.connect(endpoint)

    def _poke(self) -> None:
        """Let the accounting socket process its pending commands (new subscriptions
        among them) and read the subscriptions.

        libzmq processes a socket's commands only when its own thread calls into it, and
        sends do so throttled; a periodic call keeps a quiet gatekeeper's view of the
        master's subscription fresh, and a connection counts for sending once it is
        there (``_awaiting``). Sockets whose handshake failed are dialled again.
        """
        if self._redial:
            self._dial_again()
        if self._unproven:
            self._prove_connections()
        self._read_subscriptions()  # also lets the socket process its pending commands
        self._send_resyncs()

    def _topics(self, link: int = 0) -> list[bytes]:
        if self.domains is None:
            return [b""]
        # the rules topic also carries the master's publish counters (loss detection)
        return [*(topic(d) for d in sorted(self.domains)), RULES_TOPIC,
                *self._controls[link].replies]  # fmt: skip

    def _setup_pub(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes] | None:
        if not self.accounting:
            return None
        # an XPUB, sending as a PUB does: it also tells when a master's subscription
        # arrived, before which what is sent would be dropped silently (_awaiting)
        pub = self._secure(ctx.socket(zmq.XPUB))
        pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every master's subscription, not the first
        allow_ipv6(pub, *(acc for acc, _ctl in self.masters if acc))
        keep_alive(pub)
        if self.sharded:  # nothing queued for a master that is down: the others take it
            pub.setsockopt(zmq.IMMEDIATE, 1)
        pub.setsockopt(zmq.SNDHWM, self.sndhwm)
        # at the high-water mark a send fails (counted as accounting_dropped) instead of
        # being dropped silently by the PUB socket
        pub.setsockopt(zmq.XPUB_NODROP, 1)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.RECONNECT_IVL, 100)
        pub.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        return pub  # connected by the caller once its monitor is watching (_connect_pub)

    def _close_linger_ms(self) -> int:
        """How long closing the accounting socket waits for what is queued
        (``CLOSE_LINGER_MS``): only while a master is connected to take it."""
        return CLOSE_LINGER_MS if self._peers > 0 else 0

    def _connect_pub(self, pub: zmq.Socket[bytes]) -> None:
        """Connect the accounting PUB to every master."""
        for acc, _ctl in self.masters:
            if acc:
                pub.connect(acc)

    def _secure(self, sock: zmq.Socket[Any]) -> zmq.Socket[Any]:
        """CURVE on a socket before it connects, when configured (the one place)."""
        if self.curve is not None:
            self.curve.secure(sock)
        return sock

    def _connect_sub(self, sub: zmq.Socket[Any], link: int = 0) -> None:
        """Subscribe master ``link``'s control socket (either twin's) and connect it."""
        address = self.masters[link][1] or ""
        self._secure(sub)
        allow_ipv6(sub, address)
        keep_alive(sub)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, CONTROL_HWM)  # a burst of verdicts waits, not dropped
        sub.setsockopt(zmq.RECONNECT_IVL, 100)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        for t in self._topics(link):
            sub.setsockopt(zmq.SUBSCRIBE, t)
        sub.connect(address)
