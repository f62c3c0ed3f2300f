"""The pure heart of a gatekeeper: a table of DELAY_UNTIL times and the decision.

No sockets and no clock here: callers pass ``now_ms``. The table only moves an
identifier's time forward, forgets entries once they have passed, and is bounded so a
flood of distinct identifiers cannot exhaust memory (fail-permissive: an identifier
that cannot be remembered is simply not limited).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final, NamedTuple

from smockron.counters import CounterSet
from smockron.errors import ConfigError

Key = tuple[bytes, bytes]  # (domain, identifier)


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


class DelayTable:
    """``(domain, identifier) -> until_ms``, forward-only, expiring, bounded."""

    __slots__ = ("_entries", "_sweep_at", "dropped", "max_entries")

    def __init__(self, max_entries: int = 1_000_000) -> None:
        if max_entries < 1:
            raise ConfigError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._entries: dict[Key, int] = {}
        self._sweep_at = min(1024, max_entries)
        self.dropped = 0  # DELAY_UNTILs not remembered because the table was full

    def __len__(self) -> int:
        return len(self._entries)

    def update(self, domain: bytes, identifier: bytes, until_ms: int, now_ms: int) -> bool:
        """Remember a DELAY_UNTIL; True if it moved the identifier's time forward."""
        if until_ms <= now_ms:
            return False
        key = (domain, identifier)
        entries = self._entries
        old = entries.get(key)
        if old is not None:
            if until_ms <= old:
                return False
            entries[key] = until_ms
            return True
        if len(entries) >= self._sweep_at:
            self.sweep(now_ms)
            if len(entries) >= self.max_entries:
                self.dropped += 1
                return False
        entries[key] = until_ms
        return True

    def until(self, domain: bytes, identifier: bytes, now_ms: int) -> int:
        """The DELAY_UNTIL in force for a key, or 0 when none is or it has passed.

        Read-only on purpose: only the thread that applies control messages writes, so
        a threaded gatekeeper needs no lock here; :meth:`sweep` forgets passed entries.
        """
        until = self._entries.get((domain, identifier), 0)
        return until if until > now_ms else 0

    def sweep(self, now_ms: int) -> int:
        """Forget every passed entry; amortised so sweeps stay O(1) per update."""
        entries = self._entries
        passed = [k for k, v in entries.items() if v <= now_ms]
        for k in passed:
            del entries[k]
        self._sweep_at = min(self.max_entries, max(1024, 2 * len(entries)))
        return len(passed)


@dataclass(slots=True)
class Counters(CounterSet):
    """Running statistics of one gatekeeper."""

    accepted: int = 0
    delayed: int = 0
    rejected: int = 0
    control_received: int = 0
    control_malformed: int = 0
    control_ignored: int = 0  # well-formed but for a domain we do not serve
    accounting_sent: int = 0
    accounting_dropped: int = 0
    accounting_sampled_out: int = 0


class Decider:
    """The decision rule: accept, delay (bounded wait and count), or reject. O(1)."""

    __slots__ = ("_entries", "counters", "max_delay_ms", "max_delayed", "table", "waiting")

    def __init__(
        self, max_delay_ms: int = 5000, max_delayed: int = 1000, max_entries: int = 1_000_000
    ) -> None:
        if max_delay_ms < 0:
            raise ConfigError(f"max_delay must be >= 0, got {max_delay_ms} ms")
        if max_delayed < 0:
            raise ConfigError(f"max_delayed must be >= 0, got {max_delayed}")
        self.max_delay_ms = max_delay_ms
        self.max_delayed = max_delayed
        self.table = DelayTable(max_entries)
        self._entries = self.table._entries  # read directly: this runs on every request
        self.counters = Counters()
        self.waiting = 0  # requests delayed and not yet released

    def decide(self, domain: bytes, identifier: bytes, now_ms: int) -> Decision:
        """Decide one request. A DELAY reserves a waiting slot: call :meth:`release` after."""
        until = self._entries.get((domain, identifier), 0)
        if until <= now_ms:  # none, or passed (the sweep forgets it later)
            self.counters.accepted += 1
            return _new_decision(Decision, (ACCEPT, now_ms, 0))
        if until - now_ms <= self.max_delay_ms and self.waiting < self.max_delayed:
            self.waiting += 1
            self.counters.delayed += 1
            return _new_decision(Decision, (DELAY, now_ms, until))
        self.counters.rejected += 1
        return _new_decision(Decision, (REJECT, now_ms, until))

    def release(self) -> None:
        """A delayed request has been let through (or abandoned): free its slot."""
        if self.waiting > 0:
            self.waiting -= 1
