"""What the engine needs from a store: one table of states per (domain, rule, algorithm).

A state is a ``tuple[float, ...]``: the history's timestamps (oldest first) for the
seed's rule, or ``(V,)`` for GCRA. Tuples, never changed in place (a write puts a new
one), because CPython's garbage collector stops tracking a tuple of floats: a million
stored states then add nothing to a full collection. Tables are keyed by the
identifier's bytes. ``expires_at`` says when a state can no longer throttle anything,
so stores can forget it then.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from smockron.core import gcra, history
from smockron.core.rules import Rule

State = tuple[float, ...]
Stored = Any
"""A state as a table holds it: a ``State``, its ``bytes`` in a packed table (see
``Table.packed``), or its one float in a scalar one (``Table.scalar``)."""


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
    """When a stored state can no longer throttle anything, as its algorithm says."""
    if scope.algorithm == "gcra":
        return gcra.expires_at(state[0], scope.rule)
    return history.expires_at(state, scope.rule)


class Table(Protocol):
    packed: bool
    """Whether ``current`` and ``lasting`` hold each state packed, as one ``bytes`` of
    float64s (the memory store's history tables: smockron.master.stores.memory), not
    as a tuple; ``get``, ``put`` and ``live`` speak tuples either way."""
    scalar: bool
    """Whether ``current`` and ``lasting`` hold each state as its one float (the memory
    store's GCRA tables), not as a 1-tuple."""
    current: dict[bytes, Stored]
    """The states written since the last rotation: ``get`` looks here first, and so may
    a caller (the engine's hot path) before calling ``recall``."""
    lasting: dict[bytes, Stored]
    """The states kept beyond the generations (see ``keep``)."""
    keep_after_ms: float
    """A state written now is kept without ``keep`` until at least this plus its window;
    a write whose newest timestamp (history) or value (GCRA) lies beyond it must call
    ``keep`` with the state's expiry."""

    def get(self, key: bytes) -> State | None: ...

    def recall(self, key: bytes) -> Stored | None:
        """``get`` for a key not in ``current`` (a caller that looked there first)."""
        ...

    def put(self, key: bytes, state: State, at: float | None = None) -> None:
        """Store ``state``; ``at``: the time a GCRA update was applied at (the engine's
        ``t``), for a store that replays the update rather than storing its result (the
        original layout); None for a state not made by one step here (history, a peer's)."""
        ...

    def keep(self, key: bytes, state: Stored, until_ms: float) -> None:
        """Keep the (stored) state at least until ``until_ms``, its expiry; a tuple, in a
        packed table its bytes, in a scalar one its float."""
        ...


class Store(Protocol):
    """Everything the master asks of a store, in the order of one batch: ``tick`` (expire
    idle states), ``load`` (fetch what the batch touches and memory lacks), the engine's
    ``table`` reads and writes, then ``flush`` when ``due``. Memory needs none of the I/O
    steps and answers them at once; one processing loop serves every store.

    A store that persists is fail-permissive: ``load`` and ``flush`` count and log a
    failing backend themselves and return, so the master goes on deciding from memory.
    """

    writes_behind: bool
    """True when changes reach the backend only on ``flush`` (the master then flushes
    an idle store after a short while); False when there is nothing to write."""
    warm_start: bool
    """Whether a master of a fleet takes its peers' states at start (a store shared
    by the fleet, Redis, holds them already)."""

    def table(self, scope: Scope) -> Table:
        """The table of one scope, created on first use; unchanged scopes keep theirs."""
        ...

    def retain(self, scopes: set[Scope]) -> None:
        """Forget the tables of every other scope (rules removed by a reload)."""
        ...

    def tick(self, now_ms: float) -> None:
        """Let idle states expire; called once per batch with the master's clock."""
        ...

    async def load(self, touched: Iterable[tuple[Table, bytes]]) -> int:
        """Fetch the states among ``touched`` that memory lacks; how many were asked."""
        ...

    def due(self, now_ms: float) -> bool:
        """Whether the changes since the last ``flush`` should be written now."""
        ...

    async def flush(self, *, wait: bool = True) -> int:
        """Write what changed; how many states. ``wait=False`` may write in the
        background (``close`` waits for it)."""
        ...

    async def ping(self) -> bool:
        """Whether the backend answers (readiness); memory always does."""
        ...

    async def live(self, scope: Scope, limit: int) -> list[tuple[bytes, State]]:
        """Up to ``limit`` (identifier, state) pairs of ``scope`` that may still hold
        (memory first, then the backend's): what a RESYNC answers from. A failing
        backend is counted and logged, and memory's pairs returned."""
        ...

    async def close(self) -> None:
        """Finish a background write and release the connection."""
        ...
