"""What the threaded and asyncio gatekeepers share: configuration, decision, accounting.

Decisions are local and O(1): the control messages (``_link``) only feed the
:class:`~smockron.gatekeeper._decider.Decider`. Sending never blocks: with no master
connected, accounting messages are counted as dropped and not even encoded, so a dead
master costs nothing and every request passes (fail-permissive).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, TypedDict

import zmq

from smockron.core.shards import shard_of, shard_topics
from smockron.curve import CurveClient
from smockron.errors import ConfigError
from smockron.gatekeeper._decider import (
    ACCEPT,
    DELAY,
    MAX_IDENTIFIER,
    REJECT,
    Decider,
    Decision,
    Waiting,
    wire_identifier,
)
from smockron.gatekeeper._firstline import RuleConfig, first_lines
from smockron.gatekeeper._link import Master, _Link, now_ms
from smockron.gatekeeper._table import MAX_AHEAD_MS
from smockron.wire.batchio import send_all
from smockron.wire.codec import (
    ACCEPTED,
    DELAYED,
    REJECTED,
    accounting_frames,
    topic,
)

SWEEP_INTERVAL_S: Final = 1.0
_POLL_MS: Final = 100
_MAX_TOPIC_FRAMES: Final = 10_000  # domains from a callable could be unbounded


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
    masters: Iterable[Master | str]


class _GatekeeperBase(_Link):
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
        masters: Iterable[Master | str] = (),
    ) -> None:
        if not 0.0 <= reject_sample <= 1.0:
            raise ConfigError(f"reject_sample must be between 0 and 1, got {reject_sample}")
        self._init_link(accounting, control, domains, curve, masters)
        self.decider = Decider(max_delay_ms, max_delayed, max_entries, max_ahead_ms)
        self.counters = self.decider.counters
        self.master_rules = master_rules
        for domain, line in first_lines(rules).items():
            self.decider.set_line(domain, line)
        self.reject_sample = reject_sample
        self.sndhwm = sndhwm
        self._sample_credit = 0.0
        self._topic_frames: dict[bytes, bytes] = {}
        self._shard_frames: dict[bytes, tuple[bytes, ...]] = {}
        self._stamp_ms, self._stamp = 0, b"0"  # the last receive time and its frame
        self._setup()

    def _setup(self) -> None:
        """Subclass hook: create what the concurrency model needs."""

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
            self._send(
                waiting.domain, REJECTED, waiting.identifier, decision.received_ms, None, loginfo
            )
        else:
            self._send(
                waiting.domain,
                DELAYED,
                waiting.identifier,
                decision.received_ms,
                waiting.went_at,
                loginfo,
            )

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
        # mccabe 12, kept whole: the REJECT and DELAY accounting in a method of their
        # own cost one more call each, +2.9% instructions a decision (callgrind, a mix
        # of 16% ACCEPT, 38% DELAY, 45% REJECT: the mix of a flood, when it matters)
        if now is None:
            now = now_ms()
        if len(identifier) > MAX_IDENTIFIER:  # the master would drop it: its digest
            identifier = wire_identifier(identifier)
            self.counters.identifiers_hashed += 1
        decision = self.decider.decide(domain, identifier, now)
        verdict = decision[0]
        if verdict is ACCEPT:  # _send inlined: this runs for nearly every request
            pub = self._pub
            if pub is None or self._peers <= 0:
                self.counters.accounting_dropped += 1
                return decision
            if self.sharded:
                frame = self._shard_frame(domain, identifier)
            else:
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
        if self.sharded:
            domain_frame = self._shard_frame(domain, identifier)
        else:
            domain_frame = self._topic_frames.get(domain) or self._topic_frame(domain)
        self._emit(
            pub, accounting_frames(domain_frame, status, identifier, received, delayed, loginfo)
        )

    def _shard_frame(self, domain: bytes, identifier: bytes) -> bytes:
        """The topic of a fleet's message: the identifier's shard of the domain."""
        frames = self._shard_frames.get(domain)
        if frames is None:
            frames = shard_topics(topic(domain))
            if len(self._shard_frames) < _MAX_TOPIC_FRAMES:
                self._shard_frames[domain] = frames
        return frames[shard_of(identifier)]

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

    def _forget_passed(self, now: int) -> None:
        self.decider.table.sweep(now)
        self.decider.sweep_local(now)

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
        out["auth_problem"] = int(self.auth_problem() is not None)
        return out
