"""``memory://``: states in process memory, forgotten once they can no longer matter.

A state matters until its expiry (``expires_at``: its newest timestamp, or its GCRA
value, plus the window). Most states expire one window after their last touch, and for
those expiry uses two generations per table instead of per-key timers: a state lives in
``current``; every ``period`` (the window) the tables rotate (``current`` becomes
``previous``, and the old ``previous`` is dropped). A state touched again is moved back
to ``current``. So a state stays at least two periods after its generation started, and
is gone after at most two idle windows: O(1) per message and no scan.

Some states matter longer: a DELAYED timestamp may lie up to a minute ahead of the
receive time (the engine's ``max_delay_ahead_ms``), and a GCRA value grows ahead of the
clock while a client stays over its rate. When a write gives a state an expiry beyond
that (its newest timestamp or value is beyond ``keep_after_ms``) the engine calls
``keep``, which puts it in a side table (``lasting``) and files its key in a bucket of
its expiry (one bucket per period, in a heap). At each rotation only the buckets whose
time has passed are looked at: each key there is dropped from ``lasting`` when its state
has expired, or filed again under its later expiry. Still O(1) per message (one bucket
entry per ``keep``) and no full scan.

A dropped generation is released incrementally, ``RELEASE_PER_TICK`` states per batch,
rather than all at once: freeing a dict of a million states at once is a pause every
message queued behind it would wait for (docs/benchmarks.md). What is left of it at the
next rotation is freed at once, so memory stays bounded by three generations plus ``lasting``.

A history table (``packed``) holds each state as one ``bytes`` of float64 timestamps
rather than a tuple of float objects: one object, its timestamps inline, that the
garbage collector never tracks. Every new tuple is tracked until a young collection
looks at it, and that collection visits each of its floats: with a million
identifiers those floats lie all over memory, and packing the states took about half
off the history rule's cost there (docs/benchmarks.md). The
engine's hot path reads and writes the packed form itself, and the snapshot writes it
as it is (the file's own float64 form); ``get``, ``put`` and ``live`` speak tuples, as
every other table does.

A GCRA table (``scalar``) holds each state as its one float, not a 1-tuple: a tuple
is a second object per identifier and rule, and a domain of ten rules reads ten
tables a message, so what it costs is mostly memory; without the tuples ten rules
cost about a sixth less (docs/benchmarks.md).

Memory goes back to the system, not only to Python: ``lasting`` is rebuilt when it has
shed most of its entries (a dict never shrinks), and once enough states have been freed
the C heap is trimmed (:mod:`smockron.memory`). The master ticks an idle store too, so a
wave of identifiers that stops is released all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import heapq
import logging
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

from smockron.master.stores import snapshot as snapshot_file
from smockron.master.stores.base import Scope, State, Stored, Table, expires_at
from smockron.master.stores.uri import STORES, StoreURI
from smockron.memory import Reclaimer
from smockron.ratelog import RateLimitedLog, escaped

_log = logging.getLogger("smockron.master.store")

_T = TypeVar("_T")

RELEASE_PER_TICK = 1_000
"""States of a dropped generation freed per ``tick`` (per batch): a small slice of work."""


class _Made(dict[int, _T]):
    """A struct's ``pack`` or ``unpack`` by size, made on first use."""

    def __init__(self, make: Callable[[int], _T]) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, size: int) -> _T:
        made = self[size] = self._make(size)
        return made


UNPACK: dict[int, Callable[[bytes], State]] = _Made(
    lambda size: struct.Struct(f"<{size >> 3}d").unpack
)
"""``UNPACK[len(raw)](raw)``: a packed state's timestamps, as a tuple."""
UNPACK_FROM: dict[int, Callable[[bytes, int], State]] = _Made(
    lambda count: struct.Struct(f"<{count}d").unpack_from
)
"""``UNPACK_FROM[count](raw, offset)``: ``count`` timestamps of a packed state from
``offset`` (bytes), as a tuple: ``UNPACK_FROM[1](raw, i << 3)[0]`` is its ``i``-th."""
PACK: dict[int, Callable[..., bytes]] = _Made(lambda count: struct.Struct(f"<{count}d").pack)
"""``PACK[len(state)](*state)``: a state packed."""
PACK_ONE = PACK[1]
"""One timestamp packed: what the hot path appends to a packed state."""


_pause_lock = threading.Lock()
_pauses = 0  # how many _collector_paused blocks are running (in any thread)
_was_enabled = False  # the collector's setting when the first of them began


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No automatic garbage collection meanwhile: a million new tuples (states unpacked
    for a RESYNC, none of them garbage) would otherwise set off collections that walk
    them again and again, most of the cost of unpacking them.

    Counted, so that overlapping pauses (from two threads) give the collector back as
    it was when the last one ends, never left off."""
    global _pauses, _was_enabled
    with _pause_lock:
        if not _pauses:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pauses -= 1
            if not _pauses and _was_enabled:
                gc.enable()


def packed(state: Sequence[float]) -> bytes:
    """A state as a packed table holds it: its float64s, little-endian, in order."""
    return PACK[len(state)](*state)


def unpacked(raw: bytes) -> State:
    """The tuple of a packed state."""
    return UNPACK[len(raw)](raw)


def _one(value: float) -> State:
    """The tuple of a scalar state (a GCRA value)."""
    return (value,)


class MemoryTable:
    """Identifier -> state, in two generations rotated every ``period_ms``, plus the
    states that must outlive them (see the module docstring)."""

    __slots__ = (
        "current",
        "dropped",
        "due",
        "due_order",
        "expiry",
        "keep_after_ms",
        "lasting",
        "packed",
        "period_ms",
        "previous",
        "reclaimer",
        "scalar",
        "started_ms",
        "unstored",
    )

    def __init__(
        self,
        period_ms: float,
        expiry: Callable[[State], float] | None = None,
        reclaimer: Reclaimer | None = None,
        *,
        packed: bool = False,
        scalar: bool = False,
    ) -> None:
        self.period_ms = period_ms
        self.packed = packed
        """Whether states are held packed (``bytes``, see the module docstring); the
        memory store packs its history tables."""
        self.scalar = scalar
        """Whether each state is held as its one float (a GCRA value), not a 1-tuple;
        the memory store's GCRA tables are."""
        self.reclaimer = reclaimer or Reclaimer()
        """Told of every state freed; gives the memory back after a wave (shared by the
        tables of one store)."""
        self.unstored: Callable[[Stored], State] | None = (
            unpacked if packed else _one if scalar else None
        )
        """A stored state as a tuple (None: stored as one already)."""
        of_state: Callable[[State], float] = expiry or (lambda state: max(state) + period_ms)
        unstored = self.unstored
        self.expiry: Callable[[Stored], float] = (
            of_state if unstored is None else lambda raw: of_state(unstored(raw))
        )
        """When a stored state can no longer affect a decision (default: the history
        rule's)."""
        self.current: dict[bytes, Stored] = {}
        self.previous: dict[bytes, Stored] = {}
        self.lasting: dict[bytes, Stored] = {}
        self.due: dict[int, set[bytes]] = {}
        """Keys of ``lasting`` by bucket: ``int(expiry // period_ms)``."""
        self.due_order: list[int] = []
        """The buckets of ``due``, a heap."""
        self.dropped: list[dict[bytes, Stored]] = []
        """Dropped generations, being released a little at every tick."""
        self.started_ms: float | None = None
        self.keep_after_ms = float("-inf")
        """The generations keep a state written now until at least this plus the
        period (two periods after the current generation started); a state whose newest
        timestamp or GCRA value lies beyond it matters longer and is given to ``keep``."""

    def get(self, key: bytes) -> State | None:
        state = self.current.get(key)
        if state is None:
            state = self.recall(key)
        unstored = self.unstored
        return state if state is None or unstored is None else unstored(state)

    def recall(self, key: bytes) -> Stored | None:
        """A state not in the current generation, as stored (packed in a packed table):
        from the previous one or the lasting side table, moved into the current one.
        The engine's hot paths read ``current`` themselves and call this on a miss
        only."""
        if self.previous:
            state = self.previous.pop(key, None)
            if state is not None:
                self.current[key] = state
                return state
        if self.lasting:
            state = self.lasting.get(key)
            if state is not None:
                self.current[key] = state
                return state
        return None

    def put(self, key: bytes, state: State, at: float | None = None) -> None:
        stored = packed(state) if self.packed else state[0] if self.scalar else state
        self.current[key] = stored
        lasting = self.lasting
        if lasting and key in lasting:  # the side table must not keep the older state
            lasting[key] = stored

    def keep(self, key: bytes, state: Stored, until_ms: float) -> None:
        """Keep ``state`` until ``until_ms``, its expiry: as stored (``current[key]``
        after a ``put``; in a packed table its bytes)."""
        self.lasting[key] = state
        bucket = int(until_ms // self.period_ms)
        keys = self.due.get(bucket)
        if keys is None:
            keys = self.due[bucket] = set()
            heapq.heappush(self.due_order, bucket)
        keys.add(key)

    def tick(self, now_ms: float) -> None:
        """Rotate when a period has passed; after two idle periods only ``lasting``
        states that still matter are left. Memory freed goes back to the system."""
        self._rotate(now_ms)
        if self.reclaimer.due:
            self.reclaimer.reclaim()

    def _rotate(self, now_ms: float) -> None:
        if self.dropped:
            self._release()
        if self.started_ms is None:
            self.started_ms = now_ms
            self.keep_after_ms = now_ms + self.period_ms
            return
        elapsed = now_ms - self.started_ms
        if elapsed < self.period_ms:
            return
        # Whatever an earlier rotation left unreleased is freed here, at once.
        unreleased = sum(map(len, self.dropped))
        if elapsed >= 2 * self.period_ms:  # idle: both generations are done with
            self.dropped = [self.previous, self.current]
            self.previous = {}
        else:
            self.dropped = [self.previous]
            self.previous = self.current
        self.current = {}
        self.started_ms = now_ms
        self.keep_after_ms = now_ms + self.period_ms
        if unreleased:
            self.reclaimer.note(unreleased, self._held())
        if self.due_order:
            self._expire(now_ms)

    def _release(self) -> None:
        dropped = self.dropped[-1]
        if len(dropped) <= RELEASE_PER_TICK:
            self.dropped.pop()
            last = len(dropped)
            del dropped  # its hash table, sized for the whole generation, goes with it
            self.reclaimer.note(last, self._held())
            return
        popitem = dropped.popitem
        for _ in range(RELEASE_PER_TICK):
            popitem()
        self.reclaimer.note(RELEASE_PER_TICK, self._held())

    def _expire(self, now_ms: float) -> None:
        """Drop the ``lasting`` states whose bucket has passed and that have expired."""
        period, order, due, lasting = self.period_ms, self.due_order, self.due, self.lasting
        before = len(lasting)
        while order and (order[0] + 1) * period <= now_ms:
            for key in due.pop(heapq.heappop(order)):
                state = lasting.get(key)
                if state is None:
                    continue
                until = self.expiry(state)
                if until <= now_ms:
                    del lasting[key]
                else:  # extended since it was filed: file it again, later
                    self.keep(key, state, until)
        if len(lasting) < before:
            self.reclaimer.compact(lasting)
            self.reclaimer.note(before - len(lasting), self._held())

    def states(self, stored: list[tuple[bytes, Stored]]) -> list[tuple[bytes, State]]:
        """``(identifier, state)`` pairs as stored here, as tuples (``stored`` itself
        when the table holds tuples)."""
        if self.scalar:
            with _collector_paused():
                return [(key, (value,)) for key, value in stored]
        if not self.packed:
            return stored
        unpack = UNPACK
        with _collector_paused():
            return [(key, unpack[len(raw)](raw)) for key, raw in stored]

    def _held(self) -> int:
        """States held in the live tables (an upper bound: a state may be in two)."""
        return len(self.current) + len(self.previous) + len(self.lasting)

    def __len__(self) -> int:
        if not self.lasting:
            return len(self.current) + len(self.previous)
        return len(self.current.keys() | self.previous.keys() | self.lasting.keys())


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


def scope_expiry(scope: Scope) -> Callable[[State], float]:
    """``expires_at`` for the states of one scope."""
    return lambda state: expires_at(state, scope)


@STORES.register
class MemoryStore(TableSet[MemoryTable]):
    """The default store: states in this process only. With ``snapshot`` (a path) the
    states are written there every ``snapshot_interval_s`` and on ``close``, and read
    back when the store is made (expired ones skipped), so a restarted master does not
    forgive everyone; without it every I/O step is a no-op."""

    scheme = "memory"
    schemes: ClassVar[tuple[str, ...]] = ("memory",)
    writes_behind = False
    warm_start = True

    @classmethod
    def open(cls, uri: StoreURI, snapshot: str | None, snapshot_interval: float) -> MemoryStore:
        return cls(snapshot, snapshot_interval)

    def __init__(
        self,
        snapshot: str | Path | None = None,
        snapshot_interval_s: float = 30.0,
        *,
        now_ms: float | None = None,
    ) -> None:
        super().__init__()
        self.reclaimer = Reclaimer()
        self.snapshot = Path(snapshot) if snapshot else None
        self.snapshot_interval_ms = snapshot_interval_s * 1000.0
        self.now_ms = time.time() * 1000.0 if now_ms is None else now_ms
        self.snapshot_writes = 0
        self.snapshot_failures = 0
        self.snapshot_states = 0
        """States in the last snapshot written (or loaded)."""
        self._written_ms = self.now_ms
        self._loaded_ms = self.now_ms
        self._pending: dict[bytes, dict[bytes, State]] = {}
        self._writing: asyncio.Task[int] | None = None
        self._log = RateLimitedLog(_log, interval=60.0)
        if self.snapshot is not None:
            self._load(self.snapshot)

    def _load(self, path: Path) -> None:
        """Read the snapshot; a corrupt one is refused with one warning (start empty)."""
        try:
            tables = snapshot_file.read(path)
        except (OSError, snapshot_file.SnapshotError) as exc:
            _log.warning("snapshot %s refused (%s): starting with no state", path, escaped(exc))
            return
        if tables is None:
            _log.info("snapshot %s does not exist yet: starting with no state", path)
            return
        self._pending = tables
        self.snapshot_states = sum(map(len, tables.values()))
        _log.info(
            "snapshot %s: %d state(s) of %d rule(s) read", path, self.snapshot_states, len(tables)
        )

    def _new_table(self, scope: Scope) -> MemoryTable:
        table = MemoryTable(
            scope.rule.window_ms,
            scope_expiry(scope),
            self.reclaimer,
            packed=scope.algorithm != "gcra",
            scalar=scope.algorithm == "gcra",
        )
        states = self._pending.pop(scope.key_prefix, None)
        if states:
            restore(table, scope, states, self._loaded_ms)
        return table

    def tick(self, now_ms: float) -> None:
        self.now_ms = now_ms
        self._pending.clear()  # states of rules that no longer exist
        super().tick(now_ms)

    async def load(self, touched: Iterable[tuple[Table, bytes]]) -> int:
        return 0

    def due(self, now_ms: float) -> bool:
        """Whether a periodic snapshot is due (never without a snapshot path)."""
        return self.snapshot is not None and now_ms - self._written_ms >= self.snapshot_interval_ms

    async def flush(self, *, wait: bool = True) -> int:
        """Write a snapshot if one is due; in a thread, the states gathered first."""
        if self._writing is not None:
            if not self._writing.done():
                return 0  # one write at a time; the next one is due again at once
            self._writing = None
        if not self.due(self.now_ms):
            return 0
        self._written_ms = self.now_ms
        blob_of = self._gather()
        self._writing = asyncio.ensure_future(asyncio.to_thread(self._write, blob_of))
        if wait:
            await self.drain()
        return 0

    async def drain(self) -> None:
        """Wait for the snapshot being written, if any."""
        writing, self._writing = self._writing, None
        if writing is not None:
            await writing

    def _gather(self) -> dict[bytes, list[tuple[bytes, Stored]]]:
        """Every live state by scope prefix (newest wins), as stored; copied on the loop
        thread."""
        return {
            scope.key_prefix: list({**t.lasting, **t.previous, **t.current}.items())
            for scope, t in self.tables.items()
        }

    def _write(self, tables: dict[bytes, list[tuple[bytes, Stored]]]) -> int:
        """Encode and atomically write (off the loop thread when periodic); packed states
        go into the file as they are held, never unpacked. A failure is counted and
        logged, never raised."""
        assert self.snapshot is not None
        try:
            snapshot_file.write(self.snapshot, snapshot_file.encode(tables))
        except OSError as exc:
            self.snapshot_failures += 1
            self._log.warning("snapshot %s not written: %s", self.snapshot, escaped(exc))
            return 0
        self.snapshot_writes += 1
        self.snapshot_states = sum(map(len, tables.values()))
        return self.snapshot_states

    async def ping(self) -> bool:
        return True

    async def live(self, scope: Scope, limit: int) -> list[tuple[bytes, State]]:
        table = self.tables.get(scope)
        return [] if table is None else memory_states(table, limit)

    async def close(self) -> None:
        """The last snapshot, of every state (a stopping master's)."""
        await self.drain()
        if self.snapshot is not None:
            count = self._write(self._gather())
            _log.info("snapshot %s: %d state(s) written", self.snapshot, count)


def restore(table: MemoryTable, scope: Scope, states: dict[bytes, State], now_ms: float) -> int:
    """Put the ``states`` that still matter at ``now_ms`` into a new table; how many.
    A state that matters longer than the generations keep it is given to ``keep``."""
    table.tick(now_ms)
    kept = 0
    for ident, state in states.items():
        until = expires_at(state, scope)
        if until <= now_ms:
            continue
        table.put(ident, state)
        if max(state) > table.keep_after_ms:
            table.keep(ident, table.current[ident], until)
        kept += 1
    return kept


def memory_states(table: MemoryTable, limit: int) -> list[tuple[bytes, State]]:
    """Up to ``limit`` states a table holds, the newest of each identifier (C-level
    copies: a million states take tens of milliseconds)."""
    merged = dict(table.lasting)
    merged.update(table.previous)
    merged.update(table.current)
    return table.states(list(merged.items())[:limit])
