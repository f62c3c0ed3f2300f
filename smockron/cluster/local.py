"""The limiter a single node runs: algorithms.check over a bounded in-memory cache.

This is the owner's side of Gubernator's ``getLocalRateLimit``: it validates each item on
its own (a bad item gets an ``error``, the others are still answered), keys the state by
``name + "_" + unique_key``, and forgets a key when its state expires or when the cache is
full (least recently used first). The request's ``created_at``, when set, is the clock
for that item, as in Gubernator v2, so a forwarded request is judged at the time it was
made. The cluster builds forwarding, batching and GLOBAL replication on top of it.

A key is kept until its state expires (``expire_at``) and at least until the
``created_at + duration`` of the request that last stored it (the end of its calendar
interval with DURATION_IS_GREGORIAN), as Gubernator keeps a cache item until then: the
expiry sweep runs on this node's clock, so a state made for a ``created_at`` behind that
clock (a client's clock, a forward in flight) would otherwise be dropped between two
requests made at the same ``created_at`` whenever the sweep reached it, and the second
request would find a full bucket.

The cache holds each state as a plain tuple of numbers (its expiry, its kind, its
fields), not as the state object: CPython's garbage collector stops tracking exact
tuples of numbers (after a pass or two), never a named tuple or a dataclass. With a
million keys a full collection now walks only the OrderedDict itself, a fraction of
what it walked before (docs/benchmarks.md).

The common cases of a check (every algorithm with hits >= 0, no GREGORIAN, RESET or
DRAIN behavior, a bucket's limit, duration and burst unchanged) run in C,
``smockron.cluster._localfast``, which writes the same entries (untracked by the
collector from the start) and answers the same responses; every other item, and every
item when the extension is not built or ``SMOCKRON_PURE_PYTHON=1``, goes through
``_check_one``. Entries made by either path are read by the other.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Final, cast

from smockron import compiled
from smockron.cluster.model import Behavior, RateLimitRequest, RateLimitResponse, Status
from smockron.compiled import optional_extension
from smockron.core import calendar
from smockron.core.algorithms import (
    HistoryState,
    LeakyBucketState,
    LimitParams,
    SlidingWindowState,
    State,
    TokenBucketState,
    check,
    expire_at,
)
from smockron.errors import InvalidParams
from smockron.memory import Reclaimer

Clock = Callable[[], int]

_GREGORIAN: Final = int(Behavior.DURATION_IS_GREGORIAN)

_SWEEP_PER_CALL = 8
"""Expired keys removed from the cold end of the cache per call, so memory follows load.
The rest is ``reclaim``'s, which the node runs on a timer: reclaiming only per call left
a node that stopped getting traffic holding every expired key (docs/benchmarks.md)."""

RECLAIM_BUDGET = 10_000
"""Entries ``reclaim`` looks at in one step: a few milliseconds under the cache lock;
smaller steps measured a higher RSS after a wave (docs/benchmarks.md)."""


_KINDS: Final = (TokenBucketState, LeakyBucketState, SlidingWindowState, HistoryState)
_KIND: Final = {kind: i for i, kind in enumerate(_KINDS)}

Entry = tuple[Any, ...]
"""A cached state: (expires at, index of its kind in ``_KINDS``, *its fields), flat: the
collector untracks one level of nested tuples per pass."""


def _pack(state: State, keep_until: int = 0) -> Entry:
    return (max(expire_at(state), keep_until), _KIND[type(state)], *state)


def _unpack(entry: Entry) -> State:
    # tuple.__new__ is NamedTuple._make without its length check: 0.2 instead of 0.4 us
    return cast(State, tuple.__new__(_KINDS[entry[1]], entry[2:]))


Responses = list[RateLimitResponse]
CompiledCheck = Callable[
    [
        Sequence[RateLimitRequest],
        int,
        "OrderedDict[str, Entry]",
        int,
        Callable[[RateLimitRequest, int], RateLimitResponse],
        bytearray,
    ],
    Responses,
]


def _load_compiled() -> CompiledCheck | None:
    """``_localfast.check`` bound to the model's types, or None (then Python checks all).
    ``SMOCKRON_PURE_PYTHON=1`` forces Python (tests run both)."""
    _localfast = optional_extension("smockron.cluster._localfast")
    if _localfast is None:
        return None
    if getattr(_localfast, "STATS", 0) != len(STATS) - 1:  # built before check counted
        compiled.mark_unusable("_localfast")
        return None
    _localfast.bind(RateLimitRequest, RateLimitResponse, Status.UNDER_LIMIT, Status.OVER_LIMIT)
    return cast(CompiledCheck, _localfast.check)


STATS: Final = ("over_limit", "hit", "miss", "unexpired_evictions", "invalid")
"""The limiter's counters, in the order of its ``stats`` buffer (the C loop counts the
first four at the same indexes): checks over the limit, cache lookups that found a live
state or none (Gubernator's hit/miss), keys evicted at ``max_keys`` before they expired,
and items rejected before any algorithm ran (empty fields, bad parameters)."""
_OVER, _HIT, _MISS, _EVICTED, _INVALID = range(len(STATS))

check_compiled: Final = _load_compiled()
"""``(requests, now, cache, max_keys, slow, stats) -> responses``: the C loop, or None."""


def epoch_ms() -> int:
    return time.time_ns() // 1_000_000


class LocalLimiter:
    """Rate limits kept in this process; implements the ``RateLimiter`` protocol."""

    def __init__(self, clock: Clock = epoch_ms, max_keys: int = 1_000_000) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys!r}")
        self._clock = clock
        self._max_keys = max_keys
        self._cache: OrderedDict[str, Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._compiled = check_compiled
        self._stats = bytearray(8 * len(STATS))
        self._counts = memoryview(self._stats).cast("Q")

    def stats(self) -> dict[str, int]:
        """The counters of ``STATS`` since start (read by /metrics when scraped)."""
        return dict(zip(STATS, self._counts.tolist(), strict=True))

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def max_keys(self) -> int:
        return self._max_keys

    async def get_rate_limits(
        self, requests: Sequence[RateLimitRequest]
    ) -> list[RateLimitResponse]:
        return self.check(requests)

    def check(
        self, requests: Sequence[RateLimitRequest], now_ms: int | None = None
    ) -> list[RateLimitResponse]:
        """Answer every request in order; ``now_ms`` overrides the clock (tests, replay)."""
        now = self._clock() if now_ms is None else now_ms
        with self._lock:
            if self._compiled is not None:
                responses = self._compiled(
                    requests, now, self._cache, self._max_keys, self._check_one, self._stats
                )
            else:
                responses = [self._check_one(req, now) for req in requests]
            self._sweep(now)
        return responses

    def get_state(self, hash_key: str, now_ms: int | None = None) -> State | None:
        """The live state of a key (for GLOBAL broadcasts), or None."""
        now = self._clock() if now_ms is None else now_ms
        with self._lock:
            entry = self._cache.get(hash_key)
            if entry is None or now >= entry[0]:
                return None
            return _unpack(entry)

    def set_state(self, hash_key: str, state: State) -> None:
        """Install a state the owner computed (GLOBAL): later checks continue from it."""
        with self._lock:
            self._store(hash_key, state)

    def _check_one(self, req: RateLimitRequest, now: int) -> RateLimitResponse:
        error = _invalid(req)
        counts = self._counts
        if error:
            counts[_INVALID] += 1
            return RateLimitResponse(error=error)
        if req.created_at:
            now = req.created_at
        key = req.hash_key
        entry = self._cache.get(key)
        state = None if entry is None or now >= entry[0] else _unpack(entry)
        params = LimitParams(
            req.hits, req.limit, req.duration, req.burst, req.algorithm, req.behavior
        )
        try:
            state, verdict = check(state, params, now)
        except InvalidParams as exc:
            counts[_INVALID] += 1
            return RateLimitResponse(error=str(exc))
        counts[_MISS if entry is None or now >= entry[0] else _HIT] += 1
        if verdict.over_limit:
            counts[_OVER] += 1
        self._store(key, state, _keep_until(req, now))
        return RateLimitResponse(
            status=Status.OVER_LIMIT if verdict.over_limit else Status.UNDER_LIMIT,
            limit=verdict.limit,
            remaining=verdict.remaining,
            reset_time=verdict.reset_time,
        )

    def _store(self, key: str, state: State, keep_until: int = 0) -> None:
        cache = self._cache
        cache[key] = _pack(state, keep_until)
        cache.move_to_end(key)
        while len(cache) > self._max_keys:
            if self._clock() < cache.popitem(last=False)[1][0]:
                self._counts[_EVICTED] += 1

    def reclaim(self, now_ms: int | None = None, budget: int = RECLAIM_BUDGET) -> tuple[int, bool]:
        """One bounded step of the expiry sweep: look at up to ``budget`` entries from
        the cold end of the cache and drop the expired ones. Returns (dropped, more):
        ``more`` when the whole budget was spent, so the caller steps again (after
        yielding) until the expired keys are gone; the work is proportional to what
        expired, and each step holds the lock a bounded time.

        The cold end holds the keys used longest ago, which in a cache of one duration
        are those that expire first; a live key there does not stop the step (as it
        stops the per-call sweep), but expired keys behind more than ``budget`` live
        ones wait for them (or for the LRU bound, ``max_keys``)."""
        now = self._clock() if now_ms is None else now_ms
        with self._lock:
            cache = self._cache
            expired: list[str] = []
            seen = 0
            for key, entry in cache.items():
                if seen >= budget:
                    break
                seen += 1
                if now >= entry[0]:
                    expired.append(key)
            for key in expired:
                del cache[key]
        return len(expired), seen >= budget and bool(expired)

    def compact(self, memory: Reclaimer) -> bool:
        """Rebuild the cache's hash table when a wave of expired keys has left it mostly
        empty (a dict never shrinks by itself); see smockron/memory.py."""
        with self._lock:
            return memory.compact(self._cache)

    def _sweep(self, now: int) -> None:
        cache = self._cache
        for _ in range(_SWEEP_PER_CALL):
            if not cache:
                return
            key, entry = next(iter(cache.items()))
            expires = entry[0]
            if now < expires:
                return
            del cache[key]


def _keep_until(req: RateLimitRequest, now: int) -> int:
    """Gubernator's cache expiry for a request made at ``now``: ``created_at + duration``,
    or the end of the calendar interval."""
    if int(req.behavior) & _GREGORIAN:
        return calendar.window(now, req.duration)[1]
    return now + req.duration


def _invalid(req: RateLimitRequest) -> str:
    """Gubernator's per-item checks, with its messages, before any algorithm runs."""
    if not req.unique_key:
        return "field 'unique_key' cannot be empty"
    if not req.name:
        return "field 'namespace' cannot be empty"
    return ""
