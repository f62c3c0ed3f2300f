"""What the engine needs from a store: one table of states per (domain, rule, algorithm).

A state is a ``tuple[float, ...]``: the history's timestamps (oldest first) for the
seed's rule, or ``(V,)`` for GCRA. Tuples, never changed in place (a write puts a new
one), because CPython's garbage collector stops tracking a tuple of floats: a million
stored states then add nothing to a full collection. Tables are keyed by the
identifier's bytes. ``expires_at`` says when a state can no longer throttle anything,
so stores can forget it then.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from smockron.core.rules import Rule

State = tuple[float, ...]


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


def expires_at(state: State, scope: Scope) -> float:
    """History: the newest timestamp plus the window. GCRA: ``V + B``, after which the
    floor ``now - B`` is above ``V`` and the state is reset anyway."""
    if scope.algorithm == "gcra":
        return state[0] + scope.rule.window_ms
    return max(state) + scope.rule.window_ms


class Table(Protocol):
    keep_after_ms: float
    """A state written now is kept without ``keep`` until at least this plus its window;
    a write whose newest timestamp (history) or value (GCRA) lies beyond it must call
    ``keep`` with the state's expiry."""

    def get(self, key: bytes) -> State | None: ...

    def put(self, key: bytes, state: State) -> None: ...

    def keep(self, key: bytes, state: State, until_ms: float) -> None:
        """Keep the (stored) state at least until ``until_ms``, its expiry."""
        ...


class Store(Protocol):
    """A factory of tables; ``tick`` lets it expire idle states once per batch."""

    def table(self, scope: Scope) -> Table: ...

    def tick(self, now_ms: float) -> None: ...
