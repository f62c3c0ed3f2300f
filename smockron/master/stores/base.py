"""What the engine needs from a store: one table of states per (domain, rule, algorithm).

A state is a ``list[float]``: the history's timestamps (oldest first) for the seed's
rule, or ``[V]`` for GCRA. Tables are keyed by the identifier's bytes. ``put`` passes
the time after which the state can no longer throttle anything, so stores can forget it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from smockron.core.rules import Rule

State = list[float]

ALGORITHMS = ("history", "gcra")


@dataclass(frozen=True, slots=True)
class Scope:
    """Which rule a table serves. A changed rule gets a fresh table (old state is moot)."""

    domain: str
    rule: Rule
    algorithm: str

    @property
    def key_prefix(self) -> bytes:
        """A stable prefix naming this scope, used by stores that share one namespace."""
        return f"{self.algorithm}:{self.domain}:{self.rule.rate!r}:{self.rule.burst}:".encode()


class Table(Protocol):
    def get(self, key: bytes) -> State | None: ...

    def put(self, key: bytes, state: State, expires_ms: float) -> None: ...


class Store(Protocol):
    """A factory of tables; ``tick`` lets it expire idle states once per batch."""

    def table(self, scope: Scope) -> Table: ...

    def tick(self, now_ms: float) -> None: ...
