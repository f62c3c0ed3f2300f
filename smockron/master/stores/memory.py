"""``memory://``: states in process memory, forgotten once idle longer than their window.

Expiry uses two generations per table instead of per-key timers: a state lives in
``current``; every ``window`` the tables rotate (``current`` becomes ``previous``, and the
old ``previous`` is dropped whole). A state touched again is moved back to ``current``.
So a state idle for more than its window is never needed (its timestamps are all outside
the window, its GCRA value is below the floor) and is gone after at most two windows:
memory stays bounded by the identifiers active in the last two windows, at O(1) per
message and no scan.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from smockron.master.stores.base import Scope, State


class MemoryTable:
    """Identifier -> state, in two generations rotated every ``period_ms``."""

    __slots__ = ("current", "period_ms", "previous", "started_ms")
    wants_put = False

    def __init__(self, period_ms: float) -> None:
        self.period_ms = period_ms
        self.current: dict[bytes, State] = {}
        self.previous: dict[bytes, State] = {}
        self.started_ms: float | None = None

    def get(self, key: bytes) -> State | None:
        state = self.current.get(key)
        if state is None and self.previous:
            state = self.previous.pop(key, None)
            if state is not None:
                self.current[key] = state
        return state

    def put(self, key: bytes, state: State) -> None:
        self.current[key] = state

    def tick(self, now_ms: float) -> None:
        """Rotate when a period has passed; after two idle periods nothing is left."""
        if self.started_ms is None:
            self.started_ms = now_ms
            return
        elapsed = now_ms - self.started_ms
        if elapsed < self.period_ms:
            return
        if elapsed >= 2 * self.period_ms:
            self.previous = {}
        else:
            self.previous = self.current
        self.current = {}
        self.started_ms = now_ms

    def __len__(self) -> int:
        return len(self.current) + len(self.previous)


TableT = TypeVar("TableT", bound=MemoryTable)


class TableSet(Generic[TableT]):
    """One table per scope, created on first use; what the memory and Redis stores share.

    Tables survive rule reloads when their rule is unchanged.
    """

    def __init__(self) -> None:
        self.tables: dict[Scope, TableT] = {}

    def _new_table(self, scope: Scope) -> TableT:
        raise NotImplementedError

    def table(self, scope: Scope) -> TableT:
        table = self.tables.get(scope)
        if table is None:
            table = self.tables[scope] = self._new_table(scope)
        return table

    def retain(self, scopes: set[Scope]) -> None:
        """Forget the tables of rules that no longer exist (after a reload)."""
        for scope in list(self.tables):
            if scope not in scopes:
                del self.tables[scope]

    def tick(self, now_ms: float) -> None:
        for table in self.tables.values():
            table.tick(now_ms)

    def __len__(self) -> int:
        return sum(len(t) for t in self.tables.values())


class MemoryStore(TableSet[MemoryTable]):
    """The default store."""

    scheme = "memory"

    def _new_table(self, scope: Scope) -> MemoryTable:
        return MemoryTable(scope.rule.window_ms)
