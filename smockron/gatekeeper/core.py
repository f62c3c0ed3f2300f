"""The Smockron gatekeeper over ZeroMQ: a threaded ``Gatekeeper`` and its asyncio twin.

Both connect (never bind) a PUB socket to the master's accounting address and a SUB
socket to its control address. Decisions are local and O(1): the control messages only
feed a :class:`~smockron.gatekeeper.state.DelayTable`. Sending never blocks: with no
master connected, accounting messages are counted as dropped and not even encoded, so
a dead master costs nothing and every request passes (fail-permissive).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from itertools import groupby
from types import TracebackType
from typing import Any, Final, TypedDict, TypeVar, cast

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from smockron.core.rules import ALGORITHMS, Rule, parse_rule_spec
from smockron.curve import HANDSHAKE_FAILED, REDIAL_S, CurveClient
from smockron.errors import ConfigError, ProtocolError
from smockron.gatekeeper.state import (
    ACCEPT,
    DELAY,
    MAX_AHEAD_MS,
    REJECT,
    Decider,
    Decision,
    Line,
    Verdict,
    Waiting,
)
from smockron.observe.heard import MasterWatch
from smockron.ratelog import RateLimitedLog
from smockron.wire.batchio import send_all, wait_readable
from smockron.wire.codec import (
    ACCEPTED,
    DEFAULT_LIMITS,
    DELAY_UNTIL,
    DELAYED,
    PUBLISHED,
    REJECTED,
    RESYNCDONE,
    RESYNCSTART,
    RULES_TOPIC,
    accounting_frames,
    decode_control,
    decode_published,
    decode_rules,
    encode_resync,
    topic,
)
from smockron.wire.control import ControlBatch, ControlRecord, drain_control

log = logging.getLogger("smockron.gatekeeper")
T = TypeVar("T")

SWEEP_INTERVAL_S: Final = 1.0
_POLL_MS: Final = 100
FLUSH_DELAY_S: Final = 0.002
"""How long the asyncio twin gathers accounting messages before one send burst."""
CONTROL_BATCH: Final = 4096
"""Control messages drained in one call."""
CONTROL_SLICE: Final = 256
"""...and applied between two turns of the loop (or lock hand-overs)."""
CONTROL_HWM: Final = 100_000
"""Control messages queued for the gatekeeper before ZeroMQ drops (the master's HWM too)."""
CONTROL_BATCHES: Final = 64
"""Batches the threaded reader drains before it sweeps and checks for stop."""
FLUSH_BATCH: Final = 256
"""A batch this large is sent at once, without waiting for the timer."""
_MONITOR_EVENTS: Final = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | HANDSHAKE_FAILED
_CURVE_EVENTS: Final = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | HANDSHAKE_FAILED
"""With CURVE a connection counts once its handshake proved the master's key."""
_MAX_TOPIC_FRAMES: Final = 10_000  # domains from a callable could be unbounded
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


RuleConfig = Mapping[str, Iterable[Rule | str]] | Iterable[str]
"""A gatekeeper's own rules: ``{"api": ["10/s:20"]}`` (or Rule objects), or master-style
specs ``["api:10/s:20"]``; an algorithm is given as ``{"api": ["gcra", "10/s:20"]}``."""


def first_lines(rules: RuleConfig) -> dict[bytes, Line | None]:
    """Each domain's first line from a gatekeeper's own rule configuration."""
    by_domain: dict[str, list[Rule]] = {}
    algorithms: dict[str, str] = {}
    items: Iterable[tuple[str, Iterable[Rule | str]]]
    if isinstance(rules, Mapping):
        items = rules.items()
    else:
        items = []
        for text in rules:
            domain, rule = parse_rule_spec(text)
            by_domain.setdefault(domain, []).append(rule)
    for domain, specs in items:
        for spec in specs:
            if isinstance(spec, Rule):
                by_domain.setdefault(domain, []).append(spec)
            elif spec in ALGORITHMS:
                algorithms[domain] = spec
            else:
                by_domain.setdefault(domain, []).append(parse_rule_spec(f"{domain}:{spec}")[1])
    return {d.encode(): Line.of(algorithms.get(d, "history"), rs) for d, rs in by_domain.items()}


def describe_line(line: Line | None) -> str:
    if line is None:
        return "none"
    return ", ".join(f"{1000.0 / i:g}/s, {t / i:g} ahead" for i, t in
                     zip(line.intervals, line.tolerances, strict=True))  # fmt: skip


def now_ms() -> int:
    """Wall-clock milliseconds since 1970: the protocol's time base."""
    return time.time_ns() // 1_000_000


def _as_bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


class GatekeeperOptions(TypedDict, total=False):
    """The gatekeeper's keyword settings, for the front ends that build one for the caller.

    The ASGI and WSGI middlewares take these as keyword arguments and hand them on, so
    every knob and its default is defined once, in :class:`Gatekeeper`'s constructor.
    """

    max_delay_ms: int
    max_delayed: int
    reject_sample: float
    sndhwm: int
    max_entries: int
    rules: RuleConfig
    master_rules: bool
    max_ahead_ms: int
    curve: CurveClient | None


class _GatekeeperBase:
    """State, decision and accounting shared by the threaded and asyncio gatekeepers."""

    def __init__(
        self,
        accounting: str | None,
        control: str | None,
        domains: Iterable[bytes | str] | None = None,
        *,
        max_delay_ms: int = 5000,
        max_delayed: int = 1000,
        reject_sample: float = 1.0,
        sndhwm: int = 10_000,
        max_entries: int = 1_000_000,
        rules: RuleConfig = (),
        master_rules: bool = True,
        max_ahead_ms: int = MAX_AHEAD_MS,
        curve: CurveClient | None = None,
    ) -> None:
        if not 0.0 <= reject_sample <= 1.0:
            raise ConfigError(f"reject_sample must be between 0 and 1, got {reject_sample}")
        for name, address in (("accounting", accounting), ("control", control)):
            if address and _ENDPOINT.match(address) is None:
                raise ConfigError(
                    f"bad {name} address {address!r}: expected a ZeroMQ endpoint such as "
                    "tcp://127.0.0.1:10004"
                )
        self.accounting = accounting
        self.control = control
        self.curve = curve
        self._monitor_events = _MONITOR_EVENTS if curve is None else _CURVE_EVENTS
        # None: subscribe to every domain (used when the domain comes from a callable)
        self.domains = None if domains is None else frozenset(_as_bytes(d) for d in domains)
        self._control_topics = {topic(d): d for d in self.domains or ()}
        """Topic frame -> domain: the DELAY_UNTILs ``drain_control`` decodes for us (with
        no domains given, none: everything takes the codec's way)."""
        self.decider = Decider(max_delay_ms, max_delayed, max_entries, max_ahead_ms)
        self.counters = self.decider.counters
        self.master_rules = master_rules
        for domain, line in first_lines(rules).items():
            self.decider.set_line(domain, line)
        self.reject_sample = reject_sample
        self.sndhwm = sndhwm
        self._sample_credit = 0.0
        self._peers = 0  # accounting connections up, from the PUB socket's monitor
        self._control_peers = 0  # control connections up, from the SUB socket's monitor
        self._pub: zmq.Socket[bytes] | None = None
        self._malformed_log = RateLimitedLog(log)
        self._handshake_log = RateLimitedLog(log, interval=60.0)
        self._redial: dict[bool, float] = {}  # control? -> when to dial again (monotonic)
        self.handshakes_failed = 0
        self._topic_frames: dict[bytes, bytes] = {}
        self._stamp_ms, self._stamp = 0, b"0"  # the last receive time and its frame
        self.watch = MasterWatch(control, now_ms())  # readiness, and the silent-master warning
        self._resync: dict[bytes, tuple[int, float]] = {}
        """Domains to ask a RESYNC for: attempts made, and when to try again (monotonic)."""
        self._received: dict[bytes, int] = {}
        """DELAY_UNTILs received per domain we serve (bounded by ``MAX_LINES``)."""
        self._heartbeat: dict[bytes, tuple[int, int]] = {}
        """Per domain, the master's publish count and our received count at its last
        heartbeat: the next one's difference in both is what was lost meanwhile."""
        self.resyncs_requested = 0
        self.resyncs_done = 0
        self._setup()

    def _setup(self) -> None:
        """Subclass hook: create what the concurrency model needs."""

    @property
    def control_connected(self) -> bool:
        """Whether the control socket is connected: verdicts can reach this gatekeeper."""
        return self._control_peers > 0

    def master_problem(self, now: int | None = None) -> str | None:
        """Why this gatekeeper does not hear from its master, or None (readiness)."""
        return self.watch.problem(now_ms() if now is None else now, self.control_connected)

    def _watch_master(self, now: int) -> None:
        """One loud line when the master stays silent (then again at most every minute)."""
        message = self.watch.warning(now, self.control_connected)
        if message is not None:
            log.warning("%s", message)

    @property
    def master_connected(self) -> bool:
        """Whether the accounting socket currently has a connection to a master."""
        return self._peers > 0

    def release(self) -> None:
        """Free the waiting slot a DELAY decision took."""
        self.decider.release()

    def check(
        self, domain: bytes, identifier: bytes, now: int | None = None, loginfo: bytes | None = None
    ) -> Decision:
        """Like :meth:`decide`, except that a DELAY is accounted when the request goes:
        pass the same domain, identifier and loginfo to ``wait_out`` (asyncio) after it,
        which waits, rechecks the master's latest time and sends the DELAYED message.
        A request that never goes (rejected after its wait) is then not charged. A DELAY
        of a domain without a first line is accounted at once, as the original
        gatekeepers do, and goes at its time: with no rules to pace by, waking requests
        would all go together at the master's latest time."""
        return self.decide(domain, identifier, now, loginfo, True)

    def account_went(self, waiting: Waiting, loginfo: bytes | None) -> None:
        """A checked DELAY went (DELAYED, at the time it went) or was refused after its
        wait (REJECTED): account it."""
        decision = waiting.decision
        if waiting.rejected:
            self._send(waiting.domain, REJECTED, waiting.identifier, decision.received_ms,
                       None, loginfo)  # fmt: skip
        else:
            self._send(waiting.domain, DELAYED, waiting.identifier, decision.received_ms,
                       waiting.went_at, loginfo)  # fmt: skip

    def decide(
        self,
        domain: bytes,
        identifier: bytes,
        now: int | None = None,
        loginfo: bytes | None = None,
        defer: bool = False,
    ) -> Decision:
        """Decide and account one request. After a DELAY, call :meth:`release`.
        (``defer``: as :meth:`check` does; one method, as this runs for every request.)"""
        if now is None:
            now = now_ms()
        decision = self.decider.decide(domain, identifier, now)
        verdict = decision[0]
        if verdict is ACCEPT:  # _send inlined: this runs for nearly every request
            pub = self._pub
            if pub is None or self._peers <= 0:
                self.counters.accounting_dropped += 1
                return decision
            frame = self._topic_frames.get(domain) or self._topic_frame(domain)
            if now != self._stamp_ms:  # under load many requests share a millisecond
                self._stamp_ms, self._stamp = now, b"%d" % now
            frames = [frame, ACCEPTED, identifier, self._stamp, b""]
            if loginfo is not None:
                frames.append(loginfo)
            self._emit(pub, frames)
        elif verdict is REJECT:
            self._sample_credit += self.reject_sample
            if self._sample_credit < 1.0:
                self.counters.accounting_sampled_out += 1
                return decision
            self._sample_credit -= 1.0
            self._send(domain, REJECTED, identifier, now, None, loginfo)
        elif verdict is DELAY and not (defer and decision.paced):
            self._send(domain, DELAYED, identifier, now, decision.until_ms, loginfo)
            if decision.paced:  # the caller will not recheck it: plain delay
                return decision._replace(paced=False)
        return decision

    def _send(
        self,
        domain: bytes,
        status: bytes,
        identifier: bytes,
        received: int,
        delayed: int | None,
        loginfo: bytes | None,
    ) -> None:
        pub = self._pub
        if pub is None or self._peers <= 0:
            self.counters.accounting_dropped += 1
            return
        # encode_accounting's frames without its checks: status and timestamps are ours,
        # and the domain's topic frame is checked once and cached
        domain_frame = self._topic_frames.get(domain) or self._topic_frame(domain)
        self._emit(
            pub, accounting_frames(domain_frame, status, identifier, received, delayed, loginfo)
        )

    def _topic_frame(self, domain: bytes) -> bytes:
        frame = topic(domain)
        if len(self._topic_frames) < _MAX_TOPIC_FRAMES:
            self._topic_frames[domain] = frame
        return frame

    def _emit(self, pub: zmq.Socket[bytes], frames: list[bytes]) -> None:
        """Send one message now (the asyncio twin batches instead)."""
        try:
            # wire.batchio.send_all: every frame in one compiled call, no pyzmq wrapper per frame
            sent = send_all(pub, [frames])
        except zmq.ZMQError:
            sent = 0
        if sent:
            self.counters.accounting_sent += 1
        else:  # at the high-water mark (the master is gone or slow) or closed
            self.counters.accounting_dropped += 1

    def _apply_control(self, frames: list[bytes], now: int) -> None:
        """Apply one control message; malformed ones are counted and logged, never raised."""
        if frames and frames[0] == RULES_TOPIC:
            if len(frames) > 1 and frames[1] == PUBLISHED:
                self._apply_published(frames)
            else:
                self._apply_rules(frames)
            return
        control = self._decoded(decode_control, frames, "control message")
        ours = control is not None and (self.domains is None or control.domain in self.domains)
        if ours and control is not None and control.command == DELAY_UNTIL:
            self._apply_delays([(control.domain, control.identifier, control.until_ms)], now)
            return
        self.counters.control_received += 1
        if control is None:
            return
        if not ours:
            self.counters.control_ignored += 1
            return
        self._resync_mark(control.domain, control.command)  # RESYNCSTART or RESYNCDONE

    def _apply_batch(self, batch: ControlBatch[bytes], now: int) -> None:
        """Apply messages as ``wire.control.drain_control`` gives them, in order: runs of
        DELAY_UNTILs for our domains already decoded (tuples) in one call each, anything
        else (raw frames) one at a time."""
        for kind, run in groupby(batch, type):
            if kind is tuple:
                self._apply_delays(cast("list[ControlRecord[bytes]]", list(run)), now)
            else:
                for frames in run:
                    self._apply_control(cast("list[bytes]", frames), now)

    def _apply_delays(self, records: list[ControlRecord[bytes]], now: int) -> None:
        """DELAY_UNTILs ``(domain, identifier, until_ms)`` for domains we serve (decoded,
        checked): counted per domain (loss detection), then remembered."""
        self.counters.control_received += len(records)
        table = self.decider.table
        refused, evicted = table.refused, table.evicted
        counts: dict[bytes, int] = {}
        self.decider.control_many(records, now, counts)
        received = self._received
        for domain, count in counts.items():
            if domain in received:
                received[domain] += count
            elif len(received) < MAX_LINES:
                received[domain] = count
        if table.refused != refused:
            until_ms, domain, identifier = next(
                (u, d, i) for d, i, u in records if u - now > table.max_ahead_ms)
            self._malformed_log.warning(
                "refusing DELAY_UNTIL %d for %r/%r: more than %d ms ahead",
                until_ms, domain[:64], identifier[:64], table.max_ahead_ms,
            )  # fmt: skip
        elif table.evicted != evicted:
            self._malformed_log.warning(
                "delay table full (%d entries): evicted the %d expiring soonest",
                table.max_entries, table.evicted - evicted,
            )  # fmt: skip

    def _resync_mark(self, domain: bytes, command: bytes) -> None:
        """The master answers a RESYNC: it started (stop asking), or it is done."""
        if command == RESYNCSTART:
            self._resync.pop(domain, None)
        elif command == RESYNCDONE:
            self.resyncs_done += 1

    def _apply_published(self, frames: list[bytes]) -> None:
        """The master's heartbeat: how many DELAY_UNTILs it published for a domain. What
        it published since the last heartbeat and we did not receive was lost (at a
        high-water mark): counted, and the domain's live verdicts asked for again."""
        heartbeat = self._decoded(decode_published, frames, "publish counter")
        if heartbeat is None:
            return
        domain, published = heartbeat
        if self.domains is not None and domain not in self.domains:
            return
        received = self._received.get(domain, 0)
        last = self._heartbeat.get(domain)
        if last is None and len(self._heartbeat) >= MAX_LINES:
            return
        self._heartbeat[domain] = (published, received)
        if last is None:  # first heartbeat since (re)connecting: our baseline
            if self.domains is None:  # subscribed to everything: domains named here
                self._want_resync((domain,))
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
            self._want_resync((domain,))

    def _want_resync(self, domains: Iterable[bytes]) -> None:
        """Ask for these domains' live verdicts (sent by :meth:`_send_resyncs`)."""
        for domain in domains:
            if domain not in self._resync and len(self._resync) < MAX_LINES:
                self._resync[domain] = (0, 0.0)

    def _send_resyncs(self) -> None:
        """Send the RESYNCs due, once the accounting socket is connected; again after
        ``RESYNC_FIRST_RETRY_S``, then every ``RESYNC_RETRY_S`` until the master answers,
        ``RESYNC_ATTEMPTS`` times at most."""
        pub = self._pub
        if not self._resync or pub is None or self._peers <= 0:
            return
        now = time.monotonic()
        for domain, (attempts, due) in list(self._resync.items()):
            if due > now:
                continue
            if attempts >= RESYNC_ATTEMPTS:
                del self._resync[domain]
                self._malformed_log.warning("no answer to RESYNC for %r: the master may not "
                                            "support it", domain[:64])  # fmt: skip
                continue
            retry = RESYNC_FIRST_RETRY_S if attempts == 0 else RESYNC_RETRY_S
            self._resync[domain] = (attempts + 1, now + retry)
            self.resyncs_requested += 1
            with contextlib.suppress(zmq.ZMQError):
                send_all(pub, [encode_resync(domain)])

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

    def _forget_passed(self, now: int) -> None:
        self.decider.table.sweep(now)
        self.decider.sweep_local(now)

    def _apply_monitor(self, frames: list[bytes], control: bool = False) -> None:
        """A connection event of the accounting socket, or (``control``) the control one."""
        try:
            event = parse_monitor_message(frames)["event"]
        except Exception:  # monitor frames come from libzmq, but never let them kill us
            return
        if event & HANDSHAKE_FAILED:
            self._handshake_failed(control)
            return
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:  # watched with CURVE only
            event = zmq.EVENT_CONNECTED  # the master's key proved: now it counts
        elif event == zmq.EVENT_DISCONNECTED and self.curve is not None:
            up = self._control_peers if control else self._peers
            if not up:
                return  # the end of a failed handshake, logged already
        if control:
            if event == zmq.EVENT_CONNECTED:
                self._control_peers += 1
                self.watch.heard(now_ms())
                log.info("control connected to %s", self.control)
                self._heartbeat.clear()  # (re)connected: what we missed is unknown...
                self._want_resync(self.domains or ())  # ...so ask for every live verdict
            elif event == zmq.EVENT_DISCONNECTED:
                self._control_peers = max(0, self._control_peers - 1)
                log.warning("control disconnected from %s: no verdicts from the master until "
                            "it is back", self.control)  # fmt: skip
        elif event == zmq.EVENT_CONNECTED:
            self._peers += 1
            log.info("accounting connected to %s", self.accounting)
        elif event == zmq.EVENT_DISCONNECTED:
            self._peers = max(0, self._peers - 1)
            log.warning("accounting disconnected from %s: failing open", self.accounting)

    def _handshake_failed(self, control: bool) -> None:
        if self.curve is None:
            why = "the master may require CURVE keys (--curve-secret, --curve-server)"
        else:
            why = ("the peer does not hold the secret key of the master this gatekeeper "
                   "pins (--curve-server), or does not allow this gatekeeper's key")  # fmt: skip
        self._handshake_log.warning("handshake with %s failed: %s",
                                    self.control if control else self.accounting, why,
                                    key="control" if control else "accounting")  # fmt: skip
        self.handshakes_failed += 1
        self._redial.setdefault(control, time.monotonic() + REDIAL_S)

    def _control_socket(self) -> zmq.Socket[Any] | None:
        """Subclass hook: the control SUB socket, once made."""
        return None

    def _dial_again(self) -> None:
        """Reconnect the sockets whose handshake failed ``REDIAL_S`` ago."""
        now = time.monotonic()
        for control, due in list(self._redial.items()):
            if due > now:
                continue
            del self._redial[control]
            sock = self._control_socket() if control else self._pub
            endpoint = self.control if control else self.accounting
            if sock is None or not endpoint:
                continue
            with contextlib.suppress(zmq.ZMQError):
                sock.disconnect(endpoint)
            with contextlib.suppress(zmq.ZMQError):
                sock.connect(endpoint)

    def _poke(self) -> None:
        """Let the PUB socket process its pending commands (new subscriptions among them).

        libzmq processes a socket's commands only when its own thread calls into it, and
        sends do so throttled; a periodic no-op call keeps a quiet gatekeeper's view of
        the master's subscription fresh, so its first messages after a reconnection are
        not dropped for want of it. Sockets whose handshake failed are dialled again.
        """
        if self._redial:
            self._dial_again()
        if self._pub is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._pub.getsockopt(zmq.EVENTS)
        self._send_resyncs()

    def _topics(self) -> list[bytes]:
        if self.domains is None:
            return [b""]
        # the rules topic also carries the master's publish counters (loss detection)
        return [*(topic(d) for d in sorted(self.domains)), RULES_TOPIC]

    def _setup_pub(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes] | None:
        if not self.accounting:
            return None
        pub = self._secure(ctx.socket(zmq.PUB))
        pub.setsockopt(zmq.SNDHWM, self.sndhwm)
        # at the high-water mark a send fails (counted as accounting_dropped) instead of
        # being dropped silently by the PUB socket
        pub.setsockopt(zmq.XPUB_NODROP, 1)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.RECONNECT_IVL, 100)
        pub.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        return pub  # connected by the caller once its monitor is watching

    def _secure(self, sock: zmq.Socket[Any]) -> zmq.Socket[Any]:
        """CURVE on a socket before it connects, when configured (the one place)."""
        if self.curve is not None:
            self.curve.secure(sock)
        return sock

    def _connect_sub(self, sub: zmq.Socket[Any]) -> None:
        """Subscribe a control socket (either twin's) to our domains and connect it."""
        self._secure(sub)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, CONTROL_HWM)  # a burst of verdicts waits, not dropped
        sub.setsockopt(zmq.RECONNECT_IVL, 100)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        for t in self._topics():
            sub.setsockopt(zmq.SUBSCRIBE, t)
        sub.connect(self.control or "")

    def stats(self) -> dict[str, int]:
        """Counters plus gauges, for logs and metrics."""
        out = self.counters.as_dict()
        out["waiting"] = self.decider.waiting
        out["delay_entries"] = len(self.decider.table)
        out["delay_table_evicted"] = self.decider.table.evicted
        out["control_refused"] = self.decider.table.refused
        out["first_lines"] = len(self.decider.lines)
        out["master_connected"] = int(self.master_connected)
        out["control_connected"] = int(self.control_connected)
        out["handshakes_failed"] = self.handshakes_failed
        return out


class Gatekeeper(_GatekeeperBase):
    """Threaded gatekeeper for WSGI servers and plain code; a daemon thread reads control."""

    def _setup(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        _batch_io_thread(self._ctx)  # it is woken by every accounting message sent
        self._pub = self._setup_pub(self._ctx)
        self._monitor = self._pub.get_monitor_socket(self._monitor_events) if self._pub else None
        if self._pub is not None and self.accounting:
            self._pub.connect(self.accounting)
        self._sub: zmq.Socket[bytes] | None = None
        self._cmonitor: zmq.Socket[bytes] | None = None
        if self.control:
            self._sub = self._ctx.socket(zmq.SUB)
            self._cmonitor = self._sub.get_monitor_socket(self._monitor_events)
            self._connect_sub(self._sub)
        self._thread = threading.Thread(target=self._run, name="smockron-gatekeeper", daemon=True)
        self._thread.start()

    def decide(
        self,
        domain: bytes,
        identifier: bytes,
        now: int | None = None,
        loginfo: bytes | None = None,
        defer: bool = False,
    ) -> Decision:
        """:meth:`_GatekeeperBase.decide` under the lock shared with the socket thread."""
        with self._lock:
            return _GatekeeperBase.decide(self, domain, identifier, now, loginfo, defer)

    def release(self) -> None:
        with self._lock:
            super().release()

    def admit(self, domain: bytes, identifier: bytes, loginfo: bytes | None = None) -> Decision:
        """Decide, and sleep through a delay; the caller turns REJECT into a response."""
        with self._lock:
            decision = _GatekeeperBase.decide(self, domain, identifier, None, loginfo, True)
        if decision.verdict is not Verdict.DELAY:
            return decision
        waiting = Waiting(self.decider, domain, identifier, decision)
        until: int | None = decision.until_ms
        try:
            while until is not None:
                time.sleep(max(0, until - now_ms()) / 1000)
                with self._lock:
                    until = waiting.woke(now_ms())
        finally:
            with self._lock:
                self.decider.release()
                if decision.paced:
                    self.account_went(waiting, loginfo)
        return decision._replace(verdict=REJECT) if waiting.rejected else decision

    def _control_socket(self) -> zmq.Socket[Any] | None:
        return self._sub

    def _run(self) -> None:
        poller = zmq.Poller()
        for sock in (self._sub, self._monitor, self._cmonitor):
            if sock is not None:
                poller.register(sock, zmq.POLLIN)
        next_sweep = time.monotonic() + SWEEP_INTERVAL_S
        while not self._stop.is_set():
            try:
                ready = dict(poller.poll(_POLL_MS))
            except zmq.ZMQError:
                break  # context terminated by close()
            if self._sub is not None and self._sub in ready:
                self._drain_sub(self._sub)
            if self._monitor is not None and self._monitor in ready:
                with self._lock:
                    self._apply_monitor(self._monitor.recv_multipart())
            if self._cmonitor is not None and self._cmonitor in ready:
                with self._lock:
                    self._apply_monitor(self._cmonitor.recv_multipart(), control=True)
            with self._lock:
                self._poke()
            if time.monotonic() >= next_sweep:
                with self._lock:
                    self._forget_passed(now_ms())
                    self._watch_master(now_ms())
                self.decider.reclaimer.reclaim()  # memory back after a wave, unlocked
                next_sweep = time.monotonic() + SWEEP_INTERVAL_S

    def _drain_sub(self, sub: zmq.Socket[bytes]) -> None:
        """Everything queued, in batches (wire.control.drain_control: one compiled call each,
        DELAY_UNTILs decoded while received), applied under the lock a slice at a time so
        requests are decided in between."""
        for _ in range(CONTROL_BATCHES):  # bounded, so sweeping and stopping still happen
            batch = drain_control(sub, CONTROL_BATCH, self._control_topics, DEFAULT_LIMITS)
            if not batch:
                return
            self.watch.heard(now_ms())
            for start in range(0, len(batch), CONTROL_SLICE):
                now = now_ms()
                with self._lock:  # the first line's times are shared with decide
                    self._apply_batch(batch[start : start + CONTROL_SLICE], now)

    def close(self) -> None:
        """Stop the reader thread and close the sockets."""
        self._stop.set()
        self._thread.join(2.0)
        with self._lock:
            for watched in (self._pub, self._sub):
                if watched is not None:
                    with contextlib.suppress(zmq.ZMQError):
                        watched.disable_monitor()
            for sock in (self._monitor, self._cmonitor, self._sub, self._pub):
                if sock is not None:
                    sock.close(0)
            self._pub = None
        self._ctx.term()

    def __enter__(self) -> Gatekeeper:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncGatekeeper(_GatekeeperBase):
    """The asyncio twin: control is read by a task, delays are ``asyncio.sleep``.

    Sockets are made in :meth:`start` (called lazily by :meth:`admit`) so they belong to
    the running loop. Everything runs on the loop's thread, so no lock is needed.
    """

    def _setup(self) -> None:
        self.flush_delay_s = FLUSH_DELAY_S  # settable: longer gathers more per wake-up
        self._actx: zmq.asyncio.Context | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batch: list[list[bytes]] = []
        self._flush_timer = False  # a _timed_flush is scheduled
        self._tasks: list[asyncio.Task[None]] = []
        self._sockets: list[zmq.Socket[Any]] = []
        self._watched: zmq.Socket[Any] | None = None  # the control socket, monitored
        self.started = False

    def start(self) -> None:
        """Connect the sockets and start the reader tasks; idempotent."""
        if self.started:
            return
        self.started = True
        self.watch.started_ms = now_ms()  # the grace before the warning counts from here
        self._loop = asyncio.get_running_loop()
        self._actx = actx = zmq.asyncio.Context()
        _batch_io_thread(actx)
        sync_ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.shadow(actx.underlying)
        self._pub = self._setup_pub(sync_ctx)  # sync socket: NOBLOCK sends, no futures
        if self._pub is not None:
            self._sockets.append(self._pub)
            events = self._monitor_events
            monitor = zmq.asyncio.Socket.from_socket(self._pub.get_monitor_socket(events))
            self._sockets.append(monitor)
            self._tasks.append(asyncio.create_task(self._read_monitor(monitor)))
            self._pub.connect(self.accounting or "")
        if self.control:
            sub = sync_ctx.socket(zmq.SUB)  # sync socket: drained in batches, never awaited
            events = self._monitor_events
            cmonitor = zmq.asyncio.Socket.from_socket(sub.get_monitor_socket(events))
            self._connect_sub(sub)
            self._sockets += [sub, cmonitor]
            self._watched = sub
            self._tasks.append(asyncio.create_task(self._read_control(sub)))
            self._tasks.append(asyncio.create_task(self._read_monitor(cmonitor, control=True)))
        self._tasks.append(asyncio.create_task(self._sweep()))

    async def admit(
        self, domain: bytes, identifier: bytes, loginfo: bytes | None = None
    ) -> Decision:
        """Decide, and wait out a delay without blocking the loop."""
        if not self.started:
            self.start()
        decision = self.decide(domain, identifier, None, loginfo, True)
        if decision.verdict is Verdict.DELAY and not await self.wait_out(
            decision, domain, identifier, loginfo
        ):
            return decision._replace(verdict=REJECT)
        return decision

    async def wait_out(
        self,
        decision: Decision,
        domain: bytes | None = None,
        identifier: bytes | None = None,
        loginfo: bytes | None = None,
    ) -> bool:
        """Sleep until a DELAY decision's time, then free its slot (also when cancelled).

        After :meth:`check` (with its domain, identifier and loginfo): wait again while
        the master has moved the identifier's time on meanwhile (:class:`Waiting`), then
        account the request; False when that went past the longest delay: the caller
        rejects the request."""
        if domain is None or identifier is None:  # nothing to recheck by
            decision = decision._replace(paced=False)
        waiting = Waiting(self.decider, domain or b"", identifier or b"", decision)
        until: int | None = decision.until_ms
        try:
            while until is not None:
                await asyncio.sleep(max(0, until - now_ms()) / 1000)
                until = waiting.woke(now_ms())
        finally:
            self.decider.release()
        if decision.paced:
            self.account_went(waiting, loginfo)
        return not waiting.rejected

    def _emit(self, pub: zmq.Socket[bytes], frames: list[bytes]) -> None:
        """Queue the message; :meth:`flush` sends the batch within ``flush_delay_s``.

        Each message sent alone wakes ZeroMQ's I/O thread (a mailbox signal, an epoll
        wake-up, a TCP write): under HTTP load that cost more CPU than everything else
        the middleware does. Gathering for 2 ms (or ``FLUSH_BATCH`` messages) shares one
        wake-up among all the requests decided meanwhile; the master learns of them 2 ms
        later, which moves no DELAY_UNTIL by more than that.
        """
        batch = self._batch
        batch.append(frames)
        if len(batch) >= FLUSH_BATCH:
            self.flush()
        elif not self._flush_timer and self._loop is not None:
            # one timer at a time: a batch flushed early leaves it armed for the next
            self._flush_timer = True
            self._loop.call_later(self.flush_delay_s, self._timed_flush)

    def _timed_flush(self) -> None:
        self._flush_timer = False
        self.flush()

    def flush(self) -> None:
        """Send every queued accounting message."""
        if not self._batch:
            return
        batch, self._batch = self._batch, []
        pub = self._pub
        if pub is None:
            self.counters.accounting_dropped += len(batch)
            return
        try:
            sent = send_all(pub, batch)  # one compiled call for the whole batch
        except zmq.ZMQError as exc:  # closed under us: the rest of the batch is lost
            sent = getattr(exc, "sent", 0)
        dropped = len(batch) - sent
        counters = self.counters
        counters.accounting_sent += sent
        counters.accounting_dropped += dropped

    def _control_socket(self) -> zmq.Socket[Any] | None:
        return self._watched

    async def _read_control(self, sub: zmq.Socket[bytes]) -> None:
        """Control messages in batches (one compiled call each), so a gatekeeper keeps
        up with a master publishing at full rate; the loop runs requests in between."""
        while True:
            batch = drain_control(sub, CONTROL_BATCH, self._control_topics, DEFAULT_LIMITS)
            if not batch:
                await wait_readable(sub, 0.25)
                continue
            self.watch.heard(now_ms())
            for start in range(0, len(batch), CONTROL_SLICE):
                self._apply_batch(batch[start : start + CONTROL_SLICE], now_ms())
                await asyncio.sleep(0)

    async def _read_monitor(self, monitor: zmq.asyncio.Socket, control: bool = False) -> None:
        while True:
            self._apply_monitor(await monitor.recv_multipart(), control)
            self._send_resyncs()  # (re)connected: ask now, not at the next sweep tick

    async def _sweep(self) -> None:
        next_sweep = time.monotonic() + SWEEP_INTERVAL_S
        while True:
            await asyncio.sleep(_POLL_MS / 1000)
            self._poke()
            if time.monotonic() >= next_sweep:
                self._forget_passed(now_ms())
                self._watch_master(now_ms())
                self.decider.reclaimer.reclaim()  # memory back after a wave
                next_sweep = time.monotonic() + SWEEP_INTERVAL_S

    async def aclose(self) -> None:
        """Send what is queued, cancel the reader tasks and close the sockets."""
        self.flush()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, zmq.ZMQError):
                await task
        self._tasks.clear()
        for watched in (self._pub, self._watched):
            if watched is not None:
                with contextlib.suppress(zmq.ZMQError):
                    watched.disable_monitor()
        for sock in reversed(self._sockets):
            sock.close(0)
        self._sockets.clear()
        self._pub = None
        if self._actx is not None:
            self._actx.term()
            self._actx = None

    async def __aenter__(self) -> AsyncGatekeeper:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
