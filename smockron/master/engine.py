"""The master's logic, without I/O: accounting frames and ``now`` in, control frames out.

For each accounting message the seed's rule (or GCRA, per domain) is applied to every
rule of the message's domain; when the next request is not allowable now, a DELAY_UNTIL
for the latest of the rules' answers is produced. REJECTED messages are counted and not
recorded; messages for a domain without rules are counted and ignored; malformed ones
are counted per reason and handed to ``on_malformed`` (the server logs them).

Clock skew: a message whose receive timestamp is farther than ``skew_tolerance_ms`` from
the master's clock is accounted at the master's ``now`` instead (a DELAYED message keeps
its delay, shifted by the same amount), and counted as skewed. A gatekeeper with a
wrong clock then neither poisons histories with far-future timestamps nor escapes its
limit with far-past ones. A DELAYED message whose delayed timestamp lies more than
``max_delay_ahead_ms`` (default 60 s, twelve times the gatekeepers' default max delay)
after its receive timestamp is clamped to that and counted as skewed too: one broken or
hostile gatekeeper cannot hold an identifier back for hours. Within the tolerance, the
history rule is applied at the message's timestamp when the master is behind it, so
queueing never lengthens a delay.

Frames are decoded once, by :mod:`smockron.wire.accounting` (while they are received,
in the server) and the codec; ``ingest`` counts the records and ``apply`` accounts them.
Processing is split in ``ingest`` and ``apply`` so that a store needing I/O (Redis) can
fetch exactly the states a batch touches between the two, in one round trip.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from smockron.core.history import verdict_of, verdicts_after
from smockron.core.shards import SHARDS, decode_shards, shard_topic
from smockron.errors import ConfigError, ProtocolError
from smockron.master.apply import apply_gcra, apply_history
from smockron.master.domains import Domain, DomainPolicy
from smockron.master.stats import Stats
from smockron.master.stores.base import Scope, State, Store, Table
from smockron.wire.accounting import Record, split_accounting
from smockron.wire.codec import (
    ACCEPTED,
    DEFAULT_LIMITS,
    DELAYED,
    REJECTED,
    RESYNC,
    Limits,
    control_frames,
    decode_accounting,
    topic,
)
from smockron.wire.fleet import SYNC, SYNC_PREFIX, valid_reply

Frames = Sequence[bytes]
BACKLOG_MS = 2000.0
"""A gatekeeper that loses its master may queue accounting (ZeroMQ keeps up to its
high-water mark) and deliver it all when it reconnects. Those requests were let through
failing open; charged now (re-timed by the skew rule, or as debt) they would throttle
clients for what they did while nobody was counting, polite ones included. So for
``BACKLOG_MS`` after a gatekeeper connects, a message that *arrived* more than the skew
tolerance after its own timestamp is counted as ``late`` and dropped. Younger ones are
charged at their own time, as an instant master would have charged them. A connection
therefore changes nothing for a gatekeeper whose clock is within the skew tolerance,
and a master that is itself behind judges by when a message arrived, not by when it got
round to it."""
MalformedHook = Callable[[ProtocolError, Frames], None]
MAX_PENDING = 10_000
"""RESYNC requests waiting for an answer, at most (more are counted and dropped: a
gatekeeper asks again)."""
MAX_PENDING_SYNCS = 64
"""Peers' warm-start requests waiting, at most."""


Decoded = Record[Domain]
"""(domain, status, identifier, receive ms, delayed ms or None): see smockron.wire."""


class Engine:
    """Applies each domain's rules to accounting messages, keeping states in ``store``."""

    def __init__(
        self,
        domains: Mapping[str, DomainPolicy],
        store: Store,
        *,
        skew_tolerance_ms: float = 2000.0,
        max_delay_ahead_ms: float = 60_000.0,
        limits: Limits = DEFAULT_LIMITS,
        stats: Stats | None = None,
        on_malformed: MalformedHook | None = None,
        backlog_ms: float = BACKLOG_MS,
        shards: frozenset[int] | None = None,
    ) -> None:
        if skew_tolerance_ms < 0:
            raise ConfigError(f"skew tolerance must be >= 0, got {skew_tolerance_ms!r}")
        self.store = store
        if max_delay_ahead_ms < 0:
            raise ConfigError(f"max delay ahead must be >= 0, got {max_delay_ahead_ms!r}")
        self.skew_tolerance_ms = skew_tolerance_ms
        self.max_delay_ahead_ms = max_delay_ahead_ms
        self.limits = limits
        self.stats = stats if stats is not None else Stats()
        self.on_malformed = on_malformed
        self.backlog_ms = backlog_ms
        self.shards = frozenset(range(SHARDS)) if shards is None else shards
        """The shards this master holds in its fleet (a fleet of one: all of them)."""
        self._backlog_until = float("-inf")
        self._by_topic: dict[bytes, Domain] = {}
        self.resync_wanted: dict[tuple[str, bytes | None], None] = {}
        """RESYNC requests not yet answered, in order: ``(domain, None)`` for a bare one
        (answered on the domain's topic: many are one resync), ``(domain, reply)`` for a
        private one (answered on the asker's reply topic); at most ``MAX_PENDING``."""
        self.sync_wanted: dict[bytes, frozenset[int]] = {}
        """Peers' warm-start requests: reply topic -> the shards it wants."""
        self.resync_requests = 0
        self.configure(domains)

    def _delayed_at(
        self, dom: Domain, received_ms: float, delayed_ms: float, now_ms: float, late: float
    ) -> float | None:
        """The time a DELAYED message is accounted at, or None for backlog (dropped).

        It was sent when the request was delayed (the original gatekeepers) or when it
        went (ours): between its two timestamps, so skew and lateness are judged by both.
        """
        ts = delayed_ms
        clamped = ts - received_ms > self.max_delay_ahead_ms
        if clamped:
            ts = received_ms + self.max_delay_ahead_ms
        sent = ts if ts > received_ms else received_ms
        if sent < late:
            dom.stats.late += 1
            return None
        tolerance = self.skew_tolerance_ms
        if received_ms - now_ms > tolerance or now_ms - sent > tolerance:
            dom.stats.skewed += 1
            return ts + now_ms - received_ms  # same delay, counted from its arrival
        if clamped:
            dom.stats.skewed += 1
        return ts

    def connected(self, now_ms: float) -> None:
        """A gatekeeper (re)connected: for ``backlog_ms`` from now, messages that arrive
        older than the skew tolerance are the backlog it queued while it had no master."""
        self._backlog_until = now_ms + self.backlog_ms

    @property
    def domains(self) -> dict[str, DomainPolicy]:
        return dict(self._policies)

    def configure(self, domains: Mapping[str, DomainPolicy]) -> None:
        """Install a new rule set; states of unchanged rules and all counters are kept."""
        by_topic = {}
        for name, policy in domains.items():
            dom = Domain(name, policy, self.store, self.stats.domain(name))
            by_topic[dom.topic] = dom
            for shard in self.shards:  # a fleet's gatekeepers publish on these
                by_topic[shard_topic(shard, dom.topic)] = dom
        self._policies = dict(domains)
        self._by_topic = by_topic
        self.store.retain({Scope(n, r, p.stored_as) for n, p in domains.items() for r in p.rules})

    @property
    def topics(self) -> dict[bytes, Domain]:
        """Configured domains by topic (name + NUL): what smockron.wire.accounting splits by."""
        return self._by_topic

    def ingest(self, records: Iterable[Decoded], raw: Iterable[Frames]) -> list[Decoded]:
        """Count a batch split by :mod:`smockron.wire.accounting` (records decoded while
        received, and raw messages for the codec); the records ``apply`` is to account:
        REJECTED, unknown and malformed messages are counted and dropped."""
        out: list[Decoded] = []
        append = out.append
        accepted, delayed = ACCEPTED, DELAYED
        for item in records:
            status = item[1]
            if status == accepted:
                item[0].stats.accepted += 1
                append(item)
            elif status == delayed:
                item[0].stats.delayed += 1
                append(item)
            else:
                item[0].stats.rejected += 1
        for frames in raw:
            self._decode_raw(frames, append)
        return out

    def process(self, batch: Iterable[Frames], now_ms: float) -> list[list[bytes]]:
        """Decode and apply a batch; the control messages to publish, in order."""
        self.store.tick(now_ms)
        return self.apply(self.decode(batch), now_ms)

    def decode(self, batch: Iterable[Frames]) -> list[Decoded]:
        """Split a batch of messages as a receive loop does, then :meth:`ingest` it."""
        return self.ingest(*split_accounting(batch, self._by_topic, self.limits))

    def _decode_raw(self, frames: Frames, append: Callable[[Decoded], None]) -> None:
        """A message the split did not decode: the codec names the problem, if any."""
        if 2 <= len(frames) <= 3 and frames[1] == RESYNC:
            self._resync_request(frames)
            return
        if len(frames) == 3 and frames[1] == SYNC and valid_reply(frames[0], SYNC_PREFIX):
            self._sync_request(frames[0], frames[2])
            return
        try:
            msg = decode_accounting(frames, self.limits)
        except ProtocolError as exc:
            self._malformed(exc, frames, self._by_topic.get(frames[0]) if frames else None)
            return
        dom = self._by_topic.get(msg.domain + b"\0")
        if dom is None:
            self.stats.unknown_domain += 1
        elif msg.status == REJECTED:
            dom.stats.rejected += 1
        else:
            if msg.status == DELAYED:
                dom.stats.delayed += 1
            else:
                dom.stats.accepted += 1
            delayed = None if msg.delayed_ms is None else float(msg.delayed_ms)
            append((dom, msg.status, msg.identifier, float(msg.received_ms), delayed))

    def _malformed(self, exc: ProtocolError, frames: Frames, dom: Domain | None) -> None:
        self.stats.malformed[exc.reason] += 1
        if dom is not None:
            dom.stats.malformed += 1
        if self.on_malformed is not None:
            self.on_malformed(exc, frames)

    def _resync_request(self, frames: Frames) -> None:
        dom = self._by_topic.get(frames[0])
        if dom is None:
            self.stats.unknown_domain += 1
            return
        reply = frames[2] if len(frames) == 3 else None
        if reply is not None and not valid_reply(reply):
            self._malformed(
                ProtocolError(
                    "bad_reply", "a RESYNC's reply topic must start with \\0smockron-resync\\0"
                ),
                frames,
                dom,
            )
            return
        self.resync_requests += 1
        if len(self.resync_wanted) < MAX_PENDING:
            self.resync_wanted[dom.name, reply] = None

    def _sync_request(self, reply: bytes, shards: bytes) -> None:
        """A peer master (re)starting asks for the states of its shards."""
        try:
            wanted = decode_shards(shards)
        except ValueError as exc:
            self._malformed(ProtocolError("bad_shards", str(exc)), [reply, SYNC, shards], None)
            return
        if len(self.sync_wanted) < MAX_PENDING_SYNCS:
            self.sync_wanted[reply] = wanted

    def scopes(self, name: str) -> list[Scope]:
        """The store scopes of a configured domain (one per distinct rule)."""
        policy = self._policies.get(name)
        if policy is None:
            return []
        return [Scope(name, rule, policy.stored_as) for rule in dict.fromkeys(policy.rules)]

    def every_scope(self) -> Iterator[Scope]:
        """The store scopes of every configured domain, domain by domain in name order."""
        for name in sorted(self._policies):
            yield from self.scopes(name)

    def live_verdicts(
        self,
        name: str,
        states: Sequence[Sequence[tuple[bytes, State]]],
        now_ms: float,
        chunk: int = 4096,
    ) -> Iterator[list[tuple[bytes, int]]]:
        """A RESYNC's DELAY_UNTILs as ``(identifier, until ms)``, ``chunk`` states at a
        time (a server sends each chunk before computing the next): one per identifier
        whose verdict is still in the future, given each scope's live states (in
        :meth:`scopes` order) as the store lists them. The caller counts those it sends
        as published (the heartbeat's count), once they are sent: a heartbeat published
        while a chunk waits must not count it. One scope, the common case, costs one
        comprehension per chunk."""
        dom = self._by_topic.get(topic(name))
        if dom is None or len(states) != len(dom.scopes):
            return
        rules = dom.rules
        if len(states) == 1:
            only = states[0]
            for at in range(0, len(only), chunk):
                yield verdicts_after(rules[0], only[at : at + chunk], dom.gcra, now_ms)
            return
        by_scope = [dict(pairs) for pairs in states]
        idents = list(dict.fromkeys(i for pairs in states for i, _ in pairs))
        for at in range(0, len(idents), chunk):
            out = []
            for ident in idents[at : at + chunk]:
                until = verdict_of(rules, [d.get(ident, ()) for d in by_scope], dom.gcra)
                if until is not None and until > now_ms:
                    out.append((ident, math.ceil(until)))
            yield out

    @staticmethod
    def touched(decoded: Iterable[Decoded]) -> Iterator[tuple[Table, bytes]]:
        """The (table, identifier) pairs ``apply`` will read, for stores that prefetch."""
        for dom, _status, ident, _received, _delayed in decoded:
            for _rule, table, _window in dom.scopes:
                yield table, ident

    def apply(
        self, decoded: Iterable[Decoded], now_ms: float, arrived_ms: float | None = None
    ) -> list[list[bytes]]:
        """Account decoded messages at ``now_ms``; DELAY_UNTIL frames for throttled ones.
        ``arrived_ms``: when the batch was received (default ``now_ms``): skew and
        lateness are judged against it, so a master behind on its queue does not take
        its own delay for the gatekeepers'."""
        out: list[list[bytes]] = []
        tolerance = self.skew_tolerance_ms
        ahead = self.max_delay_ahead_ms  # also the most debt a message can add
        arrived = now_ms if arrived_ms is None else arrived_ms
        late_before = arrived - tolerance if arrived < self._backlog_until else -math.inf
        shared = math.nan  # the last timestamp taken as it came (NaN: none yet)
        for dom, _status, ident, received_ms, delayed_ms in decoded:
            if delayed_ms is None:  # ACCEPTED, the common case, inline
                if received_ms < late_before:  # backlog: served failing open, long ago
                    dom.stats.late += 1
                    continue
                if received_ms == shared:  # the same time as the last: the same float
                    ts = shared
                elif received_ms - arrived > tolerance or arrived - received_ms > tolerance:
                    ts = arrived  # re-timed: charged when it arrived
                    dom.stats.skewed += 1
                else:
                    ts = shared = received_ms
            else:
                timed = self._delayed_at(dom, received_ms, delayed_ms, arrived, late_before)
                if timed is None:
                    continue
                ts = timed
            if dom.gcra:
                until = apply_gcra(dom, ident, ts, now_ms)
            else:
                until = apply_history(dom, ident, ts, now_ms, ahead)
            if until is not None:
                out.append(control_frames(dom.topic, ident, math.ceil(until)))
                dom.stats.published += 1
        return out
