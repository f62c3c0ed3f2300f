"""Giving memory back after a wave of identifiers has expired.

Three things keep a daemon's RSS high after its tables have emptied:

- a Python dict never shrinks when entries are deleted: a table that once held a
  million identifiers keeps a hash table sized for a million (tens of MB) even empty;
  :func:`compact` rebuilds such a dict, in place, sized for what is left;
- glibc's ``malloc`` keeps freed memory in its heap for reuse rather than returning it,
  once its dynamic mmap threshold has grown (it grows each time a large block is freed),
  and small objects freed all over the heap leave pages it cannot release from the top;
  ``malloc_trim(0)`` hands every whole free page back. :class:`Reclaimer` calls it once
  enough entries have been freed to be worth the few milliseconds it takes;
- CPython's small-object allocator (pymalloc, the default) returns a 1 MiB arena only
  when every object in it is gone, and a few survivors pin many. Scanning pymalloc's
  pools after a wave found two kinds: blocks kept on CPython's free lists (100 floats,
  2,000 tuples of each length, ...), emptied only by a full garbage collection, and
  objects made during the wave that nothing freed (the compiled ZeroMQ reader made a new
  attribute name string per call, and CPython's type attribute cache kept each one: it
  looks the name up by one interned string now). So when a wave has gone (more freed
  since the last trim than is left) the reclaimer collects, and collects once more when
  the wave is over (nothing freed for ``SETTLE_S``), for what was freed after the first
  collection; a collection costs O(live objects), paid only after freeing more than
  that. Any other object that outlives a wave pins its arena the same way (the master's
  last batch of records did, until its loop stopped keeping it while idle). What is
  left is what a running daemon keeps anyway (counters' last values, its timers' times,
  the blocks its free lists recycle), each in whichever arena it was made: a few arenas,
  measured by bench/memory.py (docs/benchmarks.md): on pymalloc a daemon keeps a part
  above its baseline after a wave, reused by the next one. Nothing here reaches into pymalloc
  itself; an operator who wants that memory back too chooses another allocator when the
  interpreter starts (``PYTHONMALLOC=malloc``, or jemalloc or mimalloc through
  ``LD_PRELOAD``; the startup line says which runs, docs/deployment.md).

Only on glibc (found through ctypes); elsewhere :func:`trim` does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
import time
from collections.abc import Callable
from typing import Any, Final

COMPACT_MIN_BYTES: Final = 1 << 20
"""A dict smaller than this is left alone: rebuilding it would gain little."""
COMPACT_BYTES_PER_ENTRY: Final = 256
"""A dict taking more than this per entry has shed most of what it held (a dict that
only grew takes 30 to 80 bytes per entry, by where it is between two resizes)."""
TRIM_AFTER_ENTRIES: Final = 100_000
"""Entries freed (across tables) before :class:`Reclaimer` calls ``malloc_trim``."""
SETTLE_S: Final = 0.5
"""After a wave, how long nothing must have been freed before the last collection."""


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it (not musl)
        fn: Any = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


_malloc_trim = _load_malloc_trim()
TRIM_AVAILABLE: Final = _malloc_trim is not None


def trim() -> bool:
    """Return the C heap's free pages to the system; False where it cannot be trimmed."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True


def oversized(table: dict[Any, Any]) -> bool:
    """Whether ``table`` holds far fewer entries than its hash table is sized for."""
    size = sys.getsizeof(table)
    return size > COMPACT_MIN_BYTES and size > COMPACT_BYTES_PER_ENTRY * len(table)


def compact(table: dict[Any, Any]) -> bool:
    """Rebuild ``table`` for the entries it has now when it has shed most of them; the
    same object afterwards, so every reference to it stays valid. True if rebuilt.

    ``clear`` frees the old hash table; ``update`` from the (compact) copy allocates one
    sized for the survivors. O(len) and only when worth it, so amortised O(1)."""
    if not oversized(table):
        return False
    survivors = table.copy()
    table.clear()
    table.update(survivors)
    return True


class Reclaimer:
    """Counts the entries a component frees; once enough have gone, :meth:`reclaim`
    gives the memory back. :meth:`note` only counts, so a table may call it under a lock
    and its owner calls :meth:`reclaim` outside (a collection can take milliseconds)."""

    __slots__ = (
        "collect_due",
        "collections",
        "compacted",
        "freed",
        "freed_at",
        "settling",
        "threshold",
        "trims",
    )

    def __init__(self, threshold: int = TRIM_AFTER_ENTRIES) -> None:
        self.threshold = threshold
        self.freed = 0
        """Entries freed since the last trim."""
        self.freed_at = 0.0
        """When entries were last freed (``time.monotonic``)."""
        self.collect_due = False
        """A wave has gone since the last trim: collect garbage before it."""
        self.settling = False
        """A wave was collected while still going: collect once more when it is over."""
        self.trims = 0
        """``malloc_trim`` calls made (for tests and statistics)."""
        self.compacted = 0
        """Dicts rebuilt by :meth:`compact`."""
        self.collections = 0
        """Full garbage collections made before a trim, after a wave."""

    def compact(self, table: dict[Any, Any]) -> bool:
        """:func:`compact`, counted; a rebuilt table makes the next trim worth it."""
        if not compact(table):
            return False
        self.compacted += 1
        self.freed = max(self.freed, self.threshold)
        return True

    def note(self, freed: int, remaining: int = 0) -> None:
        """``freed`` more entries are gone and ``remaining`` are left in the caller's
        tables. A wave has gone when more are gone than are left (at least a quarter of
        ``threshold``): its few survivors are worth a collection (free lists too)."""
        if freed:
            self.freed += freed
            self.freed_at = time.monotonic()
        if self.freed > remaining and self.freed >= self.threshold // 4:
            self.collect_due = True

    @property
    def settled(self) -> bool:
        """A wave collected while it was going has been over for ``SETTLE_S``."""
        return self.settling and time.monotonic() - self.freed_at >= SETTLE_S

    @property
    def due(self) -> bool:
        """Whether :meth:`reclaim` has work to do."""
        return TRIM_AVAILABLE and (self.collect_due or self.freed >= self.threshold or self.settled)

    def reclaim(self) -> bool:
        """Trim the C heap if enough has been freed, collecting first after a wave, and
        once more when it is over. True if it trimmed.

        The last collection empties the free lists once the wave is over: a wave is
        released over several ticks (sweeps, a generation freed a slice at a time), and
        what is freed after the first collection fills CPython's free lists again (100
        floats, 2,000 tuples of each length, ...). A block on a free list stays allocated
        for pymalloc, so each kept one of the wave's arenas (five of the master's after a
        wave of 300,000 identifiers)."""
        if not self.due:
            return False
        final = self.settled
        if self.collect_due or final:
            gc.collect()
            self.collections += 1
        self.settling = self.collect_due or (self.settling and not final)
        self.freed, self.collect_due = 0, False
        trim()
        self.trims += 1
        return True
