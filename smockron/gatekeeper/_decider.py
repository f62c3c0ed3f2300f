"""The decision: accept, delay or reject one request, from the delay table and the first line.

No sockets and no clock here: callers pass ``now_ms``. :class:`Waiting` is the recheck
of a delayed request when it wakes, written once for every front.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from itertools import groupby
from operator import itemgetter
from types import MappingProxyType
from typing import Final, NamedTuple

from smockron.counters import CounterSet
from smockron.errors import ConfigError
from smockron.gatekeeper._firstline import Line, _ceil_ms, line_admit
from smockron.gatekeeper._table import (
    _NEVER,
    MAX_AHEAD_MS,
    DelayTable,
    DelayUntil,
    Hold,
    Key,
    forget_passed,
)
from smockron.wire.codec import DEFAULT_LIMITS


class Verdict(Enum):
    ACCEPT = "accept"
    DELAY = "delay"
    REJECT = "reject"


class Decision(NamedTuple):
    """What to do with one request; ``until_ms`` is the DELAY_UNTIL in force, if any.

    A NamedTuple rather than a frozen dataclass: it is built on every request, and
    tuple construction is several times cheaper.
    """

    verdict: Verdict
    received_ms: int
    until_ms: int = 0
    paced: bool = False
    """A DELAY from a domain with a first line: a caller that waits it out rechecks
    the master's time when it wakes (:meth:`Decider.recheck`) and accounts the request
    when it goes (``AsyncGatekeeper.check``)."""

    @property
    def wait_ms(self) -> int:
        """How long the request must wait (0 when accepted)."""
        return max(0, self.until_ms - self.received_ms)


ACCEPT: Final = Verdict.ACCEPT
DELAY: Final = Verdict.DELAY
REJECT: Final = Verdict.REJECT

# Decision(...) runs the NamedTuple's generated Python __new__; tuple.__new__ with all
# three fields is the same object at less than two thirds of the cost (every request)
_new_decision: Final = tuple.__new__


MAX_RECHECKS: Final = 100
"""A delayed request waits again at most this many times for a later DELAY_UNTIL
(each wait is bounded anyway by ``max_delay_ms`` from its arrival)."""


@dataclass(slots=True)
class Counters(CounterSet):
    """Running statistics of one gatekeeper."""

    accepted: int = 0
    delayed: int = 0
    rejected: int = 0
    control_received: int = 0
    control_malformed: int = 0
    control_ignored: int = 0  # well-formed but for a domain we do not serve
    control_lost: int = 0  # published by the master (its heartbeat says) but never received
    accounting_sent: int = 0
    accounting_dropped: int = 0
    accounting_sampled_out: int = 0
    rules_received: int = 0  # the master's offers of its domains' rules
    identifiers_hashed: int = 0  # longer than a master accepts: decided by their digest
    delayed_again: int = 0  # woken from a delay to find a later DELAY_UNTIL
    rejected_after_delay: int = 0  # ... one (or woken) past max_delay from their arrival


class Decider:
    """The decision rule: accept, delay (bounded wait and count), or reject. O(1).

    A request waits for the later of the master's DELAY_UNTIL and its first line's time
    (see the module docstring); a wait longer than ``max_delay_ms``, or beyond
    ``max_delayed`` waiting requests, is a rejection, which the first line does not count.
    """

    __slots__ = (
        "_cap",
        "_entries",
        "_holds",
        "_lines",
        "_locals",
        "_next_free",
        "_several",
        "_single",
        "counters",
        "max_delay_ms",
        "max_delayed",
        "reclaimer",
        "table",
        "waiting",
    )

    def __init__(
        self,
        max_delay_ms: int = 5000,
        max_delayed: int = 1000,
        max_entries: int = 1_000_000,
        max_ahead_ms: int = MAX_AHEAD_MS,
    ) -> None:
        if max_delay_ms < 0:
            raise ConfigError(f"max_delay must be >= 0, got {max_delay_ms} ms")
        if max_delayed < 0:
            raise ConfigError(f"max_delayed must be >= 0, got {max_delayed}")
        self.max_delay_ms = max_delay_ms
        self.max_delayed = max_delayed
        self.table = DelayTable(max_entries, max_ahead_ms)
        self.reclaimer = self.table.reclaimer
        self._entries = self.table._entries  # read directly: this runs on every request
        self._lines: dict[bytes, Line] = {}
        self._single: dict[bytes, tuple[float, float, dict[bytes, float]]] = {}
        """Domains of one rule (most): interval, tolerance, and each identifier's
        theoretical arrival time, keyed by the identifier alone (its hash is cached):
        ``decide``'s fast path."""
        self._several = False
        """Whether some domain has several rules (``_decide_rules``)."""
        self._holds: dict[bytes, Hold] = {}
        """What ``control_many`` holds each domain with a first line to (``Hold``)."""
        self._cap = max_entries
        self._locals: dict[Key, tuple[float, ...]] = {}
        """Those of the others, one per rule."""
        self._next_free: dict[Key, float] = {}
        """The next slot free for a request that :meth:`recheck` must move."""
        self.counters = Counters()
        self.waiting = 0  # requests delayed and not yet released

    @property
    def lines(self) -> Mapping[bytes, Line]:
        """The first line of each domain that has one (read-only)."""
        return MappingProxyType(self._lines)

    def set_line(self, domain: bytes, line: Line | None) -> bool:
        """Install (or remove, with None) a domain's first line; True if it changed.

        A changed line starts its identifiers afresh: their old times meant other rules."""
        if self._lines.get(domain) == line:
            return False
        self._single.pop(domain, None)
        if line is None:
            self._lines.pop(domain, None)
        else:
            self._lines[domain] = line
        for table in (self._locals, self._next_free):
            for key in [key for key in table if key[0] == domain]:
                del table[key]
        if line is not None and len(line.intervals) == 1:
            # decide reads the master's DELAY_UNTILs from the line's times: carry them over
            tol = line.tolerances[0]
            held = {i: u + tol for (d, i), u in self._entries.items() if d == domain}
            self._single[domain] = (line.intervals[0], tol, held)
        self._several = len(self._lines) > len(self._single)
        self._holds = {d: None for d in self._lines}
        self._holds.update(
            (d, (tol, local, self._cap)) for d, (_i, tol, local) in self._single.items()
        )
        return True

    def decide(self, domain: bytes, identifier: bytes, now_ms: int) -> Decision:
        """Decide one request. A DELAY reserves a waiting slot: call :meth:`release` after.
        Twin of smockron.core.gcra.gcra_update for a one-rule line (``tat = V + tol``)."""
        single = self._single.get(domain)
        if single is not None:  # line_admit inlined for one rule: every request runs it
            interval, tol, local = single
            tat = local.get(identifier)
            if tat is None:
                until = self._entries.get((domain, identifier), 0)
                if until <= now_ms:
                    if len(local) < self._cap:
                        local[identifier] = now_ms + interval
                    self.counters.accepted += 1
                    return _new_decision(Decision, (ACCEPT, now_ms, 0, False))
                tat = until + tol
            # else the master's DELAY_UNTIL is in ``tat`` already (``control``)
            at = tat - tol
            if at <= now_ms:
                local[identifier] = (tat if tat > now_ms else now_ms) + interval
                self.counters.accepted += 1
                return _new_decision(Decision, (ACCEPT, now_ms, 0, False))
            return self._hold_one(local, identifier, tat + interval, at, now_ms)
        key = (domain, identifier)
        until = self._entries.get(key, 0)
        if self._several:
            line = self._lines.get(domain)
            if line is not None:
                return self._decide_rules(line, key, until, now_ms)
        if until <= now_ms:  # none, or passed (the sweep forgets it later)
            self.counters.accepted += 1
            return _new_decision(Decision, (ACCEPT, now_ms, 0, False))
        if until - now_ms <= self.max_delay_ms and self.waiting < self.max_delayed:
            return self._delay(now_ms, until, False)
        self.counters.rejected += 1
        return _new_decision(Decision, (REJECT, now_ms, until, False))

    def _hold_one(
        self, local: dict[bytes, float], identifier: bytes, tat: float, at: float, now_ms: int
    ) -> Decision:
        """:meth:`decide` for a one-rule line when the request cannot go now (before
        ``at``): a DELAY that takes its slot (the identifier's time moves on to ``tat``),
        or a REJECT. One call, as ``_ceil_ms`` was: a held request costs no more."""
        wait = int(at)
        wait += wait < at  # _ceil_ms inlined: a DELAY_UNTIL is never early
        if wait - now_ms <= self.max_delay_ms and self.waiting < self.max_delayed:
            if len(local) < self._cap or identifier in local:
                local[identifier] = tat
            self.waiting += 1
            self.counters.delayed += 1
            return _new_decision(Decision, (DELAY, now_ms, wait, True))
        self.counters.rejected += 1
        return _new_decision(Decision, (REJECT, now_ms, wait, False))

    def _decide_rules(self, line: Line, key: Key, until: int, now_ms: int) -> Decision:
        """:meth:`decide` for a domain of several rules."""
        locals_ = self._locals
        at, new = line_admit(line, locals_.get(key), until, now_ms)
        fits = len(locals_) < self._cap or key in locals_
        if at <= now_ms:
            if fits:
                locals_[key] = new
            self.counters.accepted += 1
            return _new_decision(Decision, (ACCEPT, now_ms, 0, False))
        wait = _ceil_ms(at)
        if wait - now_ms <= self.max_delay_ms and self.waiting < self.max_delayed:
            if fits:
                locals_[key] = new
            return self._delay(now_ms, wait, True)
        self.counters.rejected += 1
        return _new_decision(Decision, (REJECT, now_ms, wait, False))

    def _delay(self, now_ms: int, until: int, paced: bool) -> Decision:
        self.waiting += 1
        self.counters.delayed += 1
        return _new_decision(Decision, (DELAY, now_ms, until, paced))

    def control(self, domain: bytes, identifier: bytes, until_ms: int, now_ms: int) -> bool:
        """Apply the master's DELAY_UNTIL: remember it, and tell the first line that the
        identifier's allowance is used up until then (it admits one request at
        ``until_ms``, then spaces them). True if it moved the identifier's time on."""
        return bool(self.control_many([(domain, identifier, until_ms)], now_ms))

    def control_many(
        self, records: list[DelayUntil], now_ms: int, counts: dict[bytes, int] | None = None
    ) -> int:
        """:meth:`control` for DELAY_UNTILs ``(domain, identifier, until_ms)`` in order
        (``counts``: per domain, how many there were); how many moved an identifier's
        time on."""
        moved, unheld = self.table.update_many(records, now_ms, self._holds, counts)
        for domain, run in groupby(unheld, itemgetter(0)):  # domains of several rules
            line = self._lines[domain]
            tolerance = line.tolerances[line.fastest]
            self._hold_many(domain, line, [(i, u + tolerance) for _d, i, u in run])
        return moved

    def _hold(self, domain: bytes, identifier: bytes, line: Line, floor: float) -> None:
        """Keep the fastest rule's arrival time at least at ``floor``."""
        self._hold_many(domain, line, ((identifier, floor),))

    def _hold_many(self, domain: bytes, line: Line, holds: Iterable[tuple[bytes, float]]) -> None:
        """:meth:`_hold` for ``(identifier, floor)`` pairs of one domain, in one loop."""
        cap = self._cap
        single = self._single.get(domain)
        if single is not None:
            local = single[2]
            get = local.get
            for identifier, floor in holds:
                if get(identifier, _NEVER) < floor and (len(local) < cap or identifier in local):
                    local[identifier] = floor
            return
        k = line.fastest
        locals_ = self._locals
        for identifier, floor in holds:
            key = (domain, identifier)
            old = locals_.get(key)
            current = list(old) if old is not None else [_NEVER] * len(line.intervals)
            current[k] = max(current[k], floor)
            if len(locals_) < cap or key in locals_:
                locals_[key] = tuple(current)

    def recheck(
        self, domain: bytes, identifier: bytes, decision: Decision, now_ms: int, held: bool
    ) -> int:
        """After a delay, before the request goes on. 0: go on; a time: wait until then
        and ask again with ``held=True`` (it holds that slot); -1: that would be past
        ``max_delay_ms`` from the request's arrival, so it is rejected.

        The master may have moved the identifier's time on meanwhile: other gatekeepers'
        requests went. Then the request takes the next free slot after the master's
        time, one interval after the previous one taken here, so the requests waiting
        here go one at a time rather than all at the master's time; requests scheduled
        behind a slot taken so (``held`` False) queue after it."""
        key = (domain, identifier)
        until = self._entries.get(key, 0)
        free = self._next_free.get(key, _NEVER)
        if until <= now_ms and (held or free <= now_ms):
            return 0
        slot = until if until > free else free
        wait = _ceil_ms(slot)
        if wait - decision.received_ms > self.max_delay_ms:  # rejected: it takes no slot
            self.counters.rejected_after_delay += 1
            return -1
        line = self._lines.get(domain)
        if line is not None:
            k = line.fastest
            self._next_free[key] = slot + line.intervals[k]
            # new requests go after it
            self._hold(domain, identifier, line, slot + line.intervals[k] + line.tolerances[k])
        self.counters.delayed_again += 1
        return wait

    def sweep_local(self, now_ms: int) -> int:
        """Forget first-line times that have passed (they admit as no time would);
        tables that shed most of their entries are rebuilt in place, memory returned."""
        reclaimer = self.reclaimer
        locals_ = [local for _interval, _tol, local in self._single.values()]
        swept = sum(forget_passed(local, now_ms, reclaimer) for local in locals_)
        next_free = forget_passed(self._next_free, now_ms, reclaimer)
        several = forget_passed(self._locals, now_ms, reclaimer)  # each rule's latest time
        held = sum(map(len, locals_)) + len(self._locals) + len(self._next_free)
        reclaimer.note(swept + next_free + several, held)
        return swept + several

    def release(self) -> None:
        """A delayed request has been let through (or abandoned): free its slot."""
        if self.waiting > 0:
            self.waiting -= 1


MAX_IDENTIFIER: Final = DEFAULT_LIMITS.max_identifier
"""The longest identifier a master accepts: it drops longer ones as oversized."""
HASHED: Final = b"blake2b:"
"""What starts an identifier that stands for a longer one (:func:`wire_identifier`)."""


def wire_identifier(identifier: bytes) -> bytes:
    """The identifier a gatekeeper decides and reports a request by: the client's own,
    or, past :data:`MAX_IDENTIFIER`, a fixed-length digest of it (a bearer token of
    2,000 bytes). The same everywhere, so every gatekeeper and the master count the
    client as one, and distinct long identifiers stay distinct (no truncation)."""
    if len(identifier) <= MAX_IDENTIFIER:
        return identifier
    return HASHED + hashlib.blake2b(identifier, digest_size=32).hexdigest().encode()


class Waiting:
    """The waits of one delayed request, written once for every front (threads, asyncio,
    ASGI): sleep until ``until``, then call :meth:`woke`; when it returns None the
    request goes (or, :attr:`rejected`, is refused). Pure: the caller sleeps.

    A DELAY that is not paced (no first line) goes at its time, as the original
    gatekeepers' do. A paced one rechecks the master's latest time on waking
    (:meth:`Decider.recheck`), at most ``tries`` times. Either is refused if it wakes
    later than the longest delay allows."""

    __slots__ = ("decider", "decision", "domain", "held", "identifier", "tries", "until", "went_at")

    def __init__(
        self,
        decider: Decider,
        domain: bytes,
        identifier: bytes,
        decision: Decision,
        tries: int = MAX_RECHECKS,
    ) -> None:
        self.decider, self.domain = decider, domain
        self.identifier = wire_identifier(identifier)  # as decided (``check``)
        self.decision = decision
        self.until = decision.until_ms
        self.went_at = decision.until_ms
        """When it went: the last time it slept until (never before its first)."""
        self.tries = tries if decision.paced else 0
        self.held = False  # after the first wake it sleeps in a slot recheck gave it

    def woke(self, now_ms: int) -> int | None:
        """The next time to sleep until, or None: done waiting.

        Woken more than ``max_delay_ms`` after the request arrived (its loop or thread
        was busy when its time came), it is refused rather than let through late: the
        longest delay is a promise to the client, which a wait can only keep if it is
        checked when the wait ends, not only when it begins."""
        decider = self.decider
        if now_ms - self.decision.received_ms > decider.max_delay_ms:
            self.until = -1
            decider.counters.rejected_after_delay += 1
            return None
        if self.tries <= 0:
            return None
        self.tries -= 1
        self.went_at, self.until = (
            self.until,
            self.decider.recheck(self.domain, self.identifier, self.decision, now_ms, self.held),
        )
        self.held = True
        return self.until if self.until > 0 else None

    @property
    def rejected(self) -> bool:
        """Refused after waiting: the master's time, or the wake-up, went past the
        longest delay."""
        return self.until < 0
