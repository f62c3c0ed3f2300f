"""A master's domains: the policy a configuration gives each (rules and algorithm), and
the form the engine's hot path reads it in (topic, tables, counters)."""

from __future__ import annotations

from dataclasses import dataclass

from smockron.core.rules import Rule
from smockron.core.vocabulary import ALGORITHMS, stored_as
from smockron.errors import ConfigError
from smockron.master.stats import DomainStats
from smockron.master.stores.base import Scope, Store, Table
from smockron.master.stores.memory import MemoryTable
from smockron.wire.codec import topic

Hot = tuple[Table, float, float, int, float]
"""A rule as the hot path reads it: table, window, interval, burst and GCRA's tolerance."""


@dataclass(frozen=True, slots=True)
class DomainPolicy:
    """The rules of one domain and the algorithm that applies them."""

    rules: tuple[Rule, ...]
    algorithm: str = "history"

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(
                f"unknown algorithm {self.algorithm!r}: use one of {', '.join(ALGORITHMS)}"
            )

    @property
    def stored_as(self) -> str:
        """The store's name for this algorithm's states."""
        return stored_as(self.algorithm)


class Domain:
    """A configured domain as the hot path wants it: topic, tables, counters."""

    __slots__ = (
        "debt",
        "gcra",
        "hot",
        "name",
        "one",
        "packed",
        "plain",
        "rules",
        "scalar",
        "scopes",
        "stats",
        "topic",
    )

    def __init__(self, name: str, policy: DomainPolicy, store: Store, stats: DomainStats) -> None:
        self.name = name
        self.topic = topic(name)
        self.gcra = policy.algorithm == "gcra"
        self.debt = policy.algorithm == "history"
        self.stats = stats
        # A rule given twice is one rule: both would share one table (one Scope) and
        # record every request twice, throttling at half the burst.
        self.scopes: tuple[tuple[Rule, Table, float], ...] = tuple(
            (rule, store.table(Scope(name, rule, policy.stored_as)), rule.window_ms)
            for rule in dict.fromkeys(policy.rules)
        )
        self.rules = tuple(rule for rule, _table, _window in self.scopes)
        self.hot: tuple[Hot, ...] = tuple(
            (table, window, rule.interval_ms, rule.burst, rule.burst * rule.interval_ms)
            for rule, table, window in sorted(self.scopes, key=lambda s: (-s[0].burst, -s[2]))
        )
        """Per rule, what the hot path reads: table, window, interval, burst and GCRA's
        tolerance (``burst * interval``, as core.gcra computes it): plain locals in one
        loop instead of a Rule's properties and a core function per rule. Longest burst
        first, then longest window: each history rule's state is then the end of the one
        before it, and decided by it within one burst (``apply._apply_histories``)."""
        self.plain = all(type(table) is MemoryTable for _rule, table, _window in self.scopes)
        """Whether every table is the memory store's own (no subclass noting writes): the
        hot path then reads and writes its ``current`` generation without a call."""
        self.packed = self.plain and all(table.packed for _rule, table, _window in self.scopes)
        """Whether every table is the memory store's own holding its states packed (its
        history tables), so the hot path reads and writes their bytes."""
        self.scalar = self.plain and all(table.scalar for _rule, table, _window in self.scopes)
        """Whether every table is the memory store's own holding each state as its one
        float (its GCRA tables), so the hot path reads and writes floats."""
        self.one: tuple[Table, float, float, int] | None = None
        """A one-rule domain's table, window, interval and burst, for the hot path."""
        if len(self.scopes) == 1:
            rule, table, window = self.scopes[0]
            self.one = (table, window, rule.interval_ms, rule.burst)
