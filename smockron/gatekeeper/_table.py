"""The delay table: the master's DELAY_UNTIL times, forward-only, expiring, bounded.

No sockets and no clock here: callers pass ``now_ms``. The table only moves an
identifier's time forward, forgets entries once they have passed, and is bounded so a
flood of distinct identifiers cannot exhaust memory (fail-permissive: an identifier
that cannot be remembered is simply not limited). Its hot loops have compiled twins
(``_tablefast.c``); the pure-Python ones here are the reference the tests compare.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from operator import itemgetter
from typing import Any, Final, TypeAlias, TypeVar, cast

from smockron.compiled import optional_extension
from smockron.errors import ConfigError
from smockron.memory import Reclaimer

Key = tuple[bytes, bytes]  # (domain, identifier)
DelayUntil: TypeAlias = tuple[bytes, bytes, int]
"""A DELAY_UNTIL: ``(domain, identifier, until_ms)``."""
Hold: TypeAlias = "tuple[float, dict[bytes, float], int] | None"
"""A domain's first line as applying DELAY_UNTILs needs it: for one rule, the offset
added to a DELAY_UNTIL, the identifiers' arrival times and how many it may hold; None
for several rules (the caller holds those)."""
UpdateRun: TypeAlias = Callable[
    [
        dict[Key, int],
        list[DelayUntil],
        int,
        int,
        int,
        int,
        "Mapping[bytes, Hold] | None",
        "dict[bytes, int] | None",
    ],
    tuple[int, int, int, list[DelayUntil]],
]
Passed: TypeAlias = Callable[[Mapping[Any, Any], int], list[Any]]
_K = TypeVar("_K")

MAX_AHEAD_MS: Final = 86_400_000
"""How far ahead a DELAY_UNTIL may reach (a day): whatever holds the control port cannot
block a client until the year 9999. Longer than any window a rule of a day allows."""
_NEVER: Final = float("-inf")
EVICT_STEPS: Final = 1024
"""A full delay table evicts ``max_entries // EVICT_STEPS`` entries at a time."""
FULL_SWEEP_GAP_MS: Final = 100
"""A full table is swept (for room) at most this often while it takes new entries:
between two, eviction makes the room (a sweep scans the whole table)."""


def update_run_python(
    entries: dict[Key, int],
    records: list[DelayUntil],
    start: int,
    now_ms: int,
    max_ahead_ms: int,
    room: int,
    holds: Mapping[bytes, Hold] | None,
    counts: dict[bytes, int] | None,
) -> tuple[int, int, int, list[DelayUntil]]:
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
    unheld: list[DelayUntil] = []
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


def _held(record: DelayUntil, holds: Mapping[bytes, Hold] | None, unheld: list[DelayUntil]) -> None:
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
        "_doomed",
        "_entries",
        "_full_swept_ms",
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
        self._doomed: list[tuple[int, Key]] = []
        """Eviction candidates, the soonest to expire last (:meth:`_evict`)."""
        self._full_swept_ms: int | None = None  # when a full table was last swept
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
        records: list[DelayUntil],
        now_ms: int,
        holds: Mapping[bytes, Hold] | None = None,
        counts: dict[bytes, int] | None = None,
    ) -> tuple[int, list[DelayUntil]]:
        """Remember DELAY_UNTILs in order, in one compiled loop where built (a resync
        brings a million), sweeping (and evicting) when the table needs room. How many
        moved an identifier's time forward, and those of them ``holds`` leaves to the
        caller (all without ``holds``); see :func:`update_run_python`."""
        moved, unheld = 0, []
        start, end = 0, len(records)
        while True:
            start, refused, n, back = update_run(
                self._entries,
                records,
                start,
                now_ms,
                self.max_ahead_ms,
                self._sweep_at,
                holds,
                counts,
            )
            self.refused += refused
            moved += n
            unheld += back
            if start >= end:
                return moved, unheld
            full = len(self._entries) >= self.max_entries
            last = self._full_swept_ms
            if not full or last is None or now_ms - last >= FULL_SWEEP_GAP_MS:
                self.sweep(now_ms)  # (a full table's scan, amortised over a step each)
                self._full_swept_ms = now_ms if full else None
            if len(self._entries) >= self.max_entries:
                self._evict()

    def _evict(self) -> None:
        """Make room for a few more entries (``max_entries // EVICT_STEPS``, at least
        one) by forgetting those that expire soonest: they matter least, and a flood of
        fresh ones cannot lock out the rest (a full table that refused new entries would
        stop enforcement). Small steps, so a wave just past the bound forgets no more
        live verdicts than it must; one scan of the table finds the candidates for many
        steps (an eighth of it), checked again when their turn comes."""
        entries = self._entries
        step = max(1, self.max_entries // EVICT_STEPS)
        doomed = self._doomed
        gone = 0
        while gone < step and entries:
            if not doomed:
                soonest = heapq.nsmallest(
                    max(step, len(entries) // 8), entries.items(), key=itemgetter(1)
                )
                doomed += sorted(((until, key) for key, until in soonest), reverse=True)
            until, key = doomed.pop()
            if entries.get(key) == until:  # not moved on nor swept since the scan
                del entries[key]
                gone += 1
        self.evicted += gone
        self.reclaimer.note(gone, len(entries))

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
        if len(entries) < self.max_entries:
            self._doomed = []  # no longer full: the candidates' memory back
        if gone:
            self.reclaimer.note(gone, len(entries))
        return gone
