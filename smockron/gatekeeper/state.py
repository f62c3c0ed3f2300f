"""The pure heart of a gatekeeper: a table of DELAY_UNTIL times, a first line, the decision.

No sockets and no clock here: callers pass ``now_ms``. The table only moves an
identifier's time forward, forgets entries once they have passed, and is bounded so a
flood of distinct identifiers cannot exhaust memory (fail-permissive: an identifier
that cannot be remembered is simply not limited).

The first line: the master's verdicts arrive a reaction time after the requests that
caused them, and a burst from a connection pool is over before then. So a gatekeeper
that knows its domain's rules (from its configuration, or offered by the master) also
holds each identifier to them on its own traffic, with GCRA (one number per identifier
and rule): a burst is admitted up to the rule's burst, the rest is spaced at the rule's
rate (delayed) or rejected. A DELAY_UNTIL ``X`` from the master says the identifier's
allowance is used up until ``X``: from then on the first line admits one request at
``X`` and spaces the next ones by the fastest rule's interval, instead of letting a
whole burst through at ``X``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from itertools import groupby
from operator import itemgetter
from types import MappingProxyType
from typing import Any, Final, NamedTuple, TypeAlias, TypeVar, cast

from smockron.compiled import optional_extension
from smockron.core.rules import Rule
from smockron.counters import CounterSet
from smockron.errors import ConfigError
from smockron.memory import Reclaimer

Key = tuple[bytes, bytes]  # (domain, identifier)
Record: TypeAlias = tuple[bytes, bytes, int]
"""A DELAY_UNTIL: ``(domain, identifier, until_ms)``."""
Hold: TypeAlias = "tuple[float, dict[bytes, float], int] | None"
"""A domain's first line as applying DELAY_UNTILs needs it: for one rule, the offset
added to a DELAY_UNTIL, the identifiers' arrival times and how many it may hold; None
for several rules (the caller holds those)."""
UpdateRun: TypeAlias = Callable[
    [dict[Key, int], list[Record], int, int, int, int,
     "Mapping[bytes, Hold] | None", "dict[bytes, int] | None"],
    tuple[int, int, int, list[Record]],
]  # fmt: skip
Passed: TypeAlias = Callable[[Mapping[Any, Any], int], list[Any]]
_K = TypeVar("_K")

MAX_AHEAD_MS: Final = 86_400_000
"""How far ahead a DELAY_UNTIL may reach (a day): whatever holds the control port cannot
block a client until the year 9999. Longer than any window a rule of a day allows."""


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


def update_run_python(
    entries: dict[Key, int],
    records: list[Record],
    start: int,
    now_ms: int,
    max_ahead_ms: int,
    room: int,
    holds: Mapping[bytes, Hold] | None,
    counts: dict[bytes, int] | None,
) -> tuple[int, int, int, list[Record]]:
    """Remember ``records[start:]`` in ``entries``, forward-only, in order, until one needs
    a new entry while ``entries`` holds ``room``: returns ``(stop, refused, moved,
    unheld)``, ``stop`` that record's index (``len(records)`` when all were done) for the
    caller to make room and call again from there.

    A record already passed is skipped; one further ahead than ``max_ahead_ms`` is refused
    (counted). Of those that moved an identifier's time on (counted in ``moved``): with
    ``holds`` None, all are returned in ``unheld``; else a domain's ``(offset, local,
    cap)`` keeps ``local[identifier]`` at least at ``until_ms + offset`` (a new one only
    while ``local`` holds fewer than ``cap``), a domain's None returns the record in
    ``unheld``, an absent domain has nothing more done. ``counts``: every record done,
    counted per domain. The pure-Python twin of the compiled ``_tablefast.update_run``."""
    get = entries.get
    refused = moved = 0
    unheld: list[Record] = []
    stop = len(records)
    for index in range(start, len(records)):
        record = records[index]
        domain, identifier, until_ms = record
        if until_ms > now_ms:
            if until_ms - now_ms > max_ahead_ms:
                refused += 1
            else:
                key = (domain, identifier)
                old = get(key)
                if old is None and len(entries) >= room:
                    stop = index
                    break
                if old is None or until_ms > old:
                    entries[key] = until_ms
                    moved += 1
                    _held(record, holds, unheld)
        if counts is not None:
            counts[domain] = counts.get(domain, 0) + 1
    return stop, refused, moved, unheld


def _held(record: Record, holds: Mapping[bytes, Hold] | None, unheld: list[Record]) -> None:
    """A moved record to its first line (``update_run_python``)."""
    if holds is None:
        unheld.append(record)
        return
    domain, identifier, until_ms = record
    if domain not in holds:
        return
    hold = holds[domain]
    if hold is None:
        unheld.append(record)
        return
    offset, local, cap = hold
    floor = until_ms + offset
    if local.get(identifier, _NEVER) < floor and (len(local) < cap or identifier in local):
        local[identifier] = floor


def passed_python(table: Mapping[_K, float | tuple[float, ...]], now_ms: int) -> list[_K]:
    """The keys of ``table`` whose time (ms), or latest time for a tuple of times, is at
    most ``now_ms``: what a sweep forgets. The pure-Python twin of the compiled
    ``_tablefast.passed``."""
    return [k for k, v in table.items() if _latest(v) <= now_ms]


def _latest(time: float | tuple[float, ...]) -> float:
    return max(time) if isinstance(time, tuple) else time


_tablefast = optional_extension("smockron.gatekeeper._tablefast")
"""The compiled twins, or None (then Python does it all). ``SMOCKRON_PURE_PYTHON=1``
forces Python (tests run both)."""
update_run_compiled: Final = None if _tablefast is None else cast(UpdateRun, _tablefast.update_run)
update_run: Final[UpdateRun] = update_run_compiled or update_run_python
"""Apply a run of DELAY_UNTILs to a table (see :func:`update_run_python`)."""
passed_compiled: Final = None if _tablefast is None else cast(Passed, _tablefast.passed)
passed: Final[Passed] = passed_compiled or passed_python
"""The keys a sweep forgets (see :func:`passed_python`): a sweep runs once a second over
tables of up to a million entries, so it is compiled where built (5 to 15 ms a million
here, 30 to 160 ms in Python: bench/sweep.py)."""


def forget_passed(table: dict[Any, Any], now_ms: int, reclaimer: Reclaimer) -> int:
    """Delete the entries of ``table`` that have passed (:data:`passed`) and rebuild it
    in place if it shed most of them; how many went."""
    gone = passed(table, now_ms)
    for key in gone:
        del table[key]
    if gone:
        reclaimer.compact(table)
    return len(gone)


class DelayTable:
    """``(domain, identifier) -> until_ms``, forward-only, expiring, bounded."""

    __slots__ = (
        "_entries",
        "_sweep_at",
        "evicted",
        "max_ahead_ms",
        "max_entries",
        "reclaimer",
        "refused",
    )

    def __init__(
        self,
        max_entries: int = 1_000_000,
        max_ahead_ms: int = MAX_AHEAD_MS,
        reclaimer: Reclaimer | None = None,
    ) -> None:
        if max_entries < 1:
            raise ConfigError(f"max_entries must be >= 1, got {max_entries}")
        if max_ahead_ms < 1:
            raise ConfigError(f"max_ahead must be positive, got {max_ahead_ms} ms")
        self.max_entries = max_entries
        self.max_ahead_ms = max_ahead_ms
        self._entries: dict[Key, int] = {}
        self._sweep_at = min(1024, max_entries)
        self.evicted = 0
        """Entries evicted (the soonest to expire) to make room in a full table."""
        self.refused = 0
        """DELAY_UNTILs further ahead than ``max_ahead_ms``: refused."""
        self.reclaimer = reclaimer or Reclaimer()
        """Gives memory back once a wave of entries has passed (see :meth:`sweep`)."""

    def __len__(self) -> int:
        return len(self._entries)

    def update(self, domain: bytes, identifier: bytes, until_ms: int, now_ms: int) -> bool:
        """Remember a DELAY_UNTIL; True if it moved the identifier's time forward."""
        return self.update_many([(domain, identifier, until_ms)], now_ms)[0] > 0

    def update_many(
        self,
        records: list[Record],
        now_ms: int,
        holds: Mapping[bytes, Hold] | None = None,
        counts: dict[bytes, int] | None = None,
    ) -> tuple[int, list[Record]]:
        """Remember DELAY_UNTILs in order, in one compiled loop where built (a resync
        brings a million), sweeping (and evicting) when the table needs room. How many
        moved an identifier's time forward, and those of them ``holds`` leaves to the
        caller (all without ``holds``); see :func:`update_run_python`."""
        moved, unheld = 0, []
        start, end = 0, len(records)
        while True:
            start, refused, n, back = update_run(self._entries, records, start, now_ms,
                                                 self.max_ahead_ms, self._sweep_at, holds,
                                                 counts)  # fmt: skip
            self.refused += refused
            moved += n
            unheld += back
            if start >= end:
                return moved, unheld
            self.sweep(now_ms)
            if len(self._entries) >= self.max_entries:
                self._evict()

    def _evict(self) -> None:
        """Make room for an eighth of the table by forgetting the entries that expire
        soonest: they matter least, and a flood of fresh ones cannot lock out the rest
        (a full table that refused new entries would stop enforcement)."""
        entries = self._entries
        room = max(1, len(entries) // 8)
        for key, _until in heapq.nsmallest(room, entries.items(), key=itemgetter(1)):
            del entries[key]
        self.evicted += room
        self.reclaimer.note(room, len(entries))

    def until(self, domain: bytes, identifier: bytes, now_ms: int) -> int:
        """The DELAY_UNTIL in force for a key, or 0 when none is or it has passed.

        Read-only on purpose: only the thread that applies control messages writes, so
        a threaded gatekeeper needs no lock here; :meth:`sweep` forgets passed entries.
        """
        until = self._entries.get((domain, identifier), 0)
        return until if until > now_ms else 0

    def sweep(self, now_ms: int) -> int:
        """Forget every passed entry; amortised so sweeps stay O(1) per update. After a
        wave has passed the table is rebuilt in place (the same dict, which ``Decider``
        reads directly) and the memory given back."""
        entries = self._entries
        gone = forget_passed(entries, now_ms, self.reclaimer)
        self._sweep_at = min(self.max_entries, max(1024, 2 * len(entries)))
        if gone:
            self.reclaimer.note(gone, len(entries))
        return gone


class Line(NamedTuple):
    """A domain's rules as the first line applies them: GCRA per rule.

    ``tolerances`` say how far ahead of now an identifier's theoretical arrival time may
    be and still admit a request: ``burst - 1`` intervals for the history rule (a cold
    identifier gets exactly ``burst`` at once), ``burst`` intervals for GCRA (whose
    master admits ``burst + 1``, as the original does).
    """

    intervals: tuple[float, ...]
    tolerances: tuple[float, ...]
    fastest: int
    """The rule with the shortest interval: the spacing a DELAY_UNTIL implies."""

    @classmethod
    def of(cls, algorithm: str, rules: Iterable[Rule]) -> Line | None:
        """The line for ``rules`` (None for none: no first line)."""
        unique = tuple(dict.fromkeys(rules))
        if not unique:
            return None
        slack = 0 if algorithm == "gcra" else 1
        intervals = tuple(rule.interval_ms for rule in unique)
        tolerances = tuple((r.burst - slack) * r.interval_ms for r in unique)
        return cls(intervals, tolerances, intervals.index(min(intervals)))


_NEVER: Final = float("-inf")
MAX_RECHECKS: Final = 100
"""A delayed request waits again at most this many times for a later DELAY_UNTIL
(each wait is bounded anyway by ``max_delay_ms`` from its arrival)."""


def _ceil_ms(t: float) -> int:
    """A time as the next whole millisecond (a DELAY_UNTIL is never early)."""
    whole = int(t)
    return whole + (whole < t)


def line_admit(
    line: Line, tats: tuple[float, ...] | None, until: float, now: float
) -> tuple[float, tuple[float, ...]]:
    """When a request may pass the first line of a multi-rule domain, and the arrival
    times once it has. ``until`` is the master's DELAY_UNTIL in force (0 for none), ``now``
    the request's time. Pure; one-rule domains take an inlined copy in ``Decider``."""
    intervals, tolerances = line.intervals, line.tolerances
    current = list(tats) if tats is not None else [_NEVER] * len(intervals)
    if until > now:  # the fastest rule is used up until then
        k = line.fastest
        current[k] = max(current[k], until + tolerances[k])
    at = now
    for tat, tol in zip(current, tolerances, strict=True):
        at = max(at, tat - tol)
    return at, tuple(max(tat, at) + i for tat, i in zip(current, intervals, strict=True))


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
    delayed_again: int = 0  # woken from a delay to find a later DELAY_UNTIL
    rejected_after_delay: int = 0  # ... one past max_delay from their arrival


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
        """Decide one request. A DELAY reserves a waiting slot: call :meth:`release` after."""
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
            wait = _ceil_ms(at)
            if wait - now_ms <= self.max_delay_ms and self.waiting < self.max_delayed:
                if len(local) < self._cap or identifier in local:
                    local[identifier] = tat + interval
                return self._delay(now_ms, wait, True)
            self.counters.rejected += 1
            return _new_decision(Decision, (REJECT, now_ms, wait, False))
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
        self, records: list[Record], now_ms: int, counts: dict[bytes, int] | None = None
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


class Waiting:
    """The waits of one delayed request, written once for every front (threads, asyncio,
    ASGI): sleep until ``until``, then call :meth:`woke`; when it returns None the
    request goes (or, :attr:`rejected`, is refused). Pure: the caller sleeps.

    A DELAY that is not paced (no first line) goes at its time, as the original
    gatekeepers' do. A paced one rechecks the master's latest time on waking
    (:meth:`Decider.recheck`), at most ``tries`` times."""

    __slots__ = ("decider", "decision", "domain", "held", "identifier", "tries", "until", "went_at")

    def __init__(
        self,
        decider: Decider,
        domain: bytes,
        identifier: bytes,
        decision: Decision,
        tries: int = MAX_RECHECKS,
    ) -> None:
        self.decider, self.domain, self.identifier = decider, domain, identifier
        self.decision = decision
        self.until = decision.until_ms
        self.went_at = decision.until_ms
        """When it went: the last time it slept until (never before its first)."""
        self.tries = tries if decision.paced else 0
        self.held = False  # after the first wake it sleeps in a slot recheck gave it

    def woke(self, now_ms: int) -> int | None:
        """The next time to sleep until, or None: done waiting."""
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
        """Refused after waiting: the master's time went past the longest delay."""
        return self.until < 0
