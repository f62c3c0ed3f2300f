"""The Gubernator-compatible rate-limit algorithms, as pure functions.

``check(state, params, now_ms) -> (new_state, verdict)``: the state is an opaque value
(``None`` for a key never seen), immutable, so the caller may keep it, copy it to a peer
(GLOBAL) or drop it after ``expire_at(state)``. States are named tuples of numbers:
CPython's garbage collector stops tracking those, so a node holding a million keys adds
nothing to a full collection (as dataclasses: a pause of a few hundred ms). Four algorithms:

* TOKEN_BUCKET (0): Gubernator's, which is a fixed window: ``limit`` hits per window of
  ``duration`` ms starting at the first hit; remaining returns to ``limit`` when it ends.
* LEAKY_BUCKET (1): a bucket of ``burst`` (default ``limit``) tokens refilling
  continuously at ``limit`` per ``duration``. Kept in exact integer units (one token is
  ``period`` units, ``limit`` units leak in per ms), so tests can use an exact oracle.
* SLIDING_WINDOW (2): the two-window weighted counter (see ``_sliding``).
* SMOCKRON_HISTORY (3): the seed's history rule with rate ``limit / duration`` and burst
  ``burst or limit``.

Shared rules: ``hits == 0`` is a query that consumes nothing and is always UNDER_LIMIT;
negative hits give tokens back (the token bucket's remaining may exceed ``limit`` until
its window ends, as in Gubernator; the others are capped at their maximum); a request
whose hits do not fit is OVER_LIMIT and consumes nothing unless DRAIN_OVER_LIMIT, which
empties what is left. Status belongs to the request, not to the key: a later request that
fits is UNDER_LIMIT. RESET_REMAINING on a known key refills it and, as in Gubernator,
does not count that request's hits, except in the leaky bucket, which (again as
Gubernator) applies them after the refill. ``duration == 0`` remembers nothing.
``reset_time`` is when the key is back at its full allowance. docs/algorithms.md lists
every difference from Gubernator.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntFlag
from functools import lru_cache
from typing import NamedTuple, TypeAlias

from smockron.core import calendar, history
from smockron.core.rules import Rule
from smockron.core.vocabulary import BY_NUMBER
from smockron.core.vocabulary import Algorithm as Algorithm
from smockron.errors import InvalidParams


class Behavior(IntFlag):
    BATCHING = 0
    NO_BATCHING = 1
    GLOBAL = 2
    DURATION_IS_GREGORIAN = 4
    RESET_REMAINING = 8
    MULTI_REGION = 16
    DRAIN_OVER_LIMIT = 32


MAX_HISTORY_BURST = 10_000
"""SMOCKRON_HISTORY stores up to ``burst`` timestamps per key and scans them per check."""

_ALGORITHMS = frozenset(BY_NUMBER)
# Plain ints: IntFlag arithmetic costs a microsecond per operation on the hot path.
_GREGORIAN = int(Behavior.DURATION_IS_GREGORIAN)
_RESET = int(Behavior.RESET_REMAINING)
_DRAIN = int(Behavior.DRAIN_OVER_LIMIT)


@dataclass(slots=True)
class LimitParams:
    hits: int
    limit: int
    duration: int
    burst: int = 0
    algorithm: Algorithm = Algorithm.TOKEN_BUCKET
    behavior: Behavior = Behavior.BATCHING


@dataclass(slots=True)
class Outcome:
    """What one check answers: Gubernator's response fields, before the response is built."""

    over_limit: bool
    limit: int
    remaining: int
    reset_time: int


class TokenBucketState(NamedTuple):
    limit: int
    duration: int
    gregorian: bool
    remaining: int
    start: int
    """When the current window began (``created_at`` in Gubernator)."""
    end: int
    """When it ends (exclusive): remaining is back to ``limit`` from here on."""


class LeakyBucketState(NamedTuple):
    limit: int
    duration: int
    gregorian: bool
    burst: int
    period: int
    """Units per token: ``duration`` ms, or the calendar interval's length."""
    level: int
    """Tokens in the bucket times ``period``; ``limit`` units leak back in per ms."""
    updated: int
    window_end: int | None
    """For calendar windows, where the bucket is reset to full."""


class SlidingWindowState(NamedTuple):
    duration: int
    gregorian: bool
    start: int
    """Start of the current window."""
    end: int
    previous: int
    """Hits counted in the window before ``start``."""
    current: int
    """Hits counted in ``[start, end)``."""


class HistoryState(NamedTuple):
    limit: int
    duration: int
    burst: int
    history: tuple[float, ...]


State: TypeAlias = TokenBucketState | LeakyBucketState | SlidingWindowState | HistoryState


def check(state: State | None, params: LimitParams, now_ms: int) -> tuple[State, Outcome]:
    """Apply ``params.hits`` at ``now_ms``; raises InvalidParams for unusable params."""
    _validate(params)
    if params.duration == 0 and not int(params.behavior) & _GREGORIAN:
        return _memoryless(params, now_ms)
    algorithm = params.algorithm
    if algorithm == Algorithm.TOKEN_BUCKET:
        tb = state if isinstance(state, TokenBucketState) else None
        return _token_bucket(tb, params, now_ms)
    if algorithm == Algorithm.LEAKY_BUCKET:
        lb = state if isinstance(state, LeakyBucketState) else None
        return _leaky_bucket(lb, params, now_ms)
    if algorithm == Algorithm.SLIDING_WINDOW:
        sw = state if isinstance(state, SlidingWindowState) else None
        return _sliding(sw, params, now_ms)
    hs = state if isinstance(state, HistoryState) else None
    return _history(hs, params, now_ms)


def expire_at(state: State) -> int:
    """Epoch ms from which ``state`` behaves exactly like no state: it may be dropped."""
    if isinstance(state, TokenBucketState):
        return state.end
    if isinstance(state, LeakyBucketState):
        return _leaky_full_at(state)
    if isinstance(state, SlidingWindowState):
        return _sliding_full_at(state)
    if not state.history:
        return 0
    return _ceil(history.expires_at(state.history, _rule(state.limit, state.duration, state.burst)))


# -- validation ---------------------------------------------------------------------------


def _validate(p: LimitParams) -> None:
    if p.algorithm not in _ALGORITHMS:
        raise InvalidParams(f"invalid rate limit algorithm '{int(p.algorithm)}'")
    if p.limit < 0:
        raise InvalidParams(f"limit must be >= 0, got {p.limit}")
    if p.burst < 0:
        raise InvalidParams(f"burst must be >= 0, got {p.burst}")
    if int(p.behavior) & _GREGORIAN:
        if not calendar.is_gregorian(p.duration):
            raise InvalidParams(  # Gubernator's text first: clients match on it
                "behavior DURATION_IS_GREGORIAN is set; but `Duration` is not a valid "
                f"gregorian interval: got {p.duration} (0..5)"
            )
        if p.algorithm == Algorithm.SMOCKRON_HISTORY:
            raise InvalidParams("SMOCKRON_HISTORY does not support DURATION_IS_GREGORIAN")
    elif p.duration < 0:
        raise InvalidParams(f"duration must be >= 0 ms, got {p.duration}")
    if p.algorithm == Algorithm.SMOCKRON_HISTORY and (p.burst or p.limit) > MAX_HISTORY_BURST:
        raise InvalidParams(
            f"SMOCKRON_HISTORY keeps one timestamp per request of the burst: burst (or limit) "
            f"must be <= {MAX_HISTORY_BURST}, got {p.burst or p.limit}"
        )


def _window(p: LimitParams, now: int, start: int) -> tuple[int, int]:
    """The window a fresh key (or a changed duration) gets: calendar, or from ``start``."""
    if int(p.behavior) & _GREGORIAN:
        return calendar.window(now, p.duration)
    return start, start + p.duration


def _status(hits: int, available: int) -> bool:
    """Over limit: the hits do not fit. A query (0 hits) always fits, as in Gubernator."""
    return hits > available


def _memoryless(p: LimitParams, now: int) -> tuple[State, Outcome]:
    """``duration == 0``: a window that is over as soon as it starts, so every request is
    judged against a full allowance and nothing is remembered (Gubernator accepts it)."""
    tb = p.algorithm == Algorithm.TOKEN_BUCKET or p.algorithm == Algorithm.SLIDING_WINDOW
    maximum = p.limit if tb else p.burst or p.limit
    over = _status(p.hits, maximum)
    if over:
        remaining = 0 if int(p.behavior) & _DRAIN else maximum
    else:
        remaining = maximum - p.hits if tb else min(maximum, maximum - p.hits)
    state = TokenBucketState(p.limit, 0, False, remaining, now, now)
    return state, Outcome(over, p.limit, remaining, now)


def _ceil(x: float) -> int:
    n = int(x)
    return n + 1 if n < x else n


# -- token bucket (Gubernator's fixed window) ----------------------------------------------


def _token_bucket(
    s: TokenBucketState | None, p: LimitParams, now: int
) -> tuple[TokenBucketState, Outcome]:
    gregorian = bool(int(p.behavior) & _GREGORIAN)
    hits, reset = p.hits, False
    if s is None or now >= s.end:
        start, end = _window(p, now, now)
        remaining = p.limit
    else:
        start, end, remaining = s.start, s.end, s.remaining
        if s.limit != p.limit:
            remaining = max(0, remaining + p.limit - s.limit)
        if s.duration != p.duration or s.gregorian != gregorian:
            start, end = _window(p, now, start)
            if end <= now:
                start, end, remaining = now, now + p.duration, p.limit
        if int(p.behavior) & _RESET:
            remaining, hits, reset = p.limit, 0, True
    over = not reset and _status(hits, remaining)
    if hits > 0 and over:
        if int(p.behavior) & _DRAIN:
            remaining = 0
    elif hits:
        remaining -= hits  # negative hits may raise it above limit, as in Gubernator
    state = TokenBucketState(p.limit, p.duration, gregorian, remaining, start, end)
    return state, Outcome(over, p.limit, remaining, end)


# -- leaky bucket --------------------------------------------------------------------------


def _leaky_bucket(
    s: LeakyBucketState | None, p: LimitParams, now: int
) -> tuple[LeakyBucketState, Outcome]:
    gregorian = bool(int(p.behavior) & _GREGORIAN)
    burst = p.burst or p.limit
    window_end: int | None = None
    period = p.duration
    if gregorian:
        start, window_end = calendar.window(now, p.duration)
        period = window_end - start
    if s is None or (s.window_end is not None and now >= s.window_end):
        level = burst * period
    else:
        # Leak since the last update (a clock going back leaks nothing), then reconcile.
        level = s.level
        if now > s.updated:
            level = min(s.burst * s.period, level + (now - s.updated) * s.limit)
        if period != s.period:
            level = level * period // s.period
        if burst > s.burst:
            level += (burst - s.burst) * period  # more room by the difference
        level = max(0, min(burst * period, level))
        if int(p.behavior) & _RESET:
            level = burst * period
    hits = p.hits
    over = _status(hits, level // period)
    if hits > 0 and over:
        if int(p.behavior) & _DRAIN:
            level = 0
    elif hits:
        level = min(burst * period, level - hits * period)
    updated = now if s is None else max(now, s.updated)
    state = LeakyBucketState(
        p.limit, p.duration, gregorian, burst, period, level, updated, window_end
    )
    return state, Outcome(over, p.limit, level // period, _leaky_full_at(state))


def _leaky_full_at(s: LeakyBucketState) -> int:
    """When the bucket is full again (or reset by its calendar window)."""
    missing = s.burst * s.period - s.level
    if missing <= 0:
        return s.updated
    full = s.updated + -(-missing // s.limit) if s.limit > 0 else s.updated + s.period
    return full if s.window_end is None else min(full, s.window_end)


# -- sliding window ------------------------------------------------------------------------


def _sliding(
    s: SlidingWindowState | None, p: LimitParams, now: int
) -> tuple[SlidingWindowState, Outcome]:
    """Two-window weighted counter.

    Windows are aligned to the epoch (``k * duration``) or to the calendar. With ``c``
    hits counted in the current window ``[start, end)`` and ``q`` in the one before, the
    estimate at ``now`` is ``q * (end - now) / (end - start) + c``; a request fits when
    estimate + hits <= limit, and remaining is ``floor(limit - estimate)``. All integer.
    """
    gregorian = bool(int(p.behavior) & _GREGORIAN)
    if s is not None:
        now = max(now, s.start)  # a clock going back does not lose the current window
    if gregorian:
        start, end = calendar.window(now, p.duration)
    else:
        start = now - now % p.duration
        end = start + p.duration
    previous = current = 0
    if s is not None and s.duration == p.duration and s.gregorian == gregorian:
        if s.start == start:
            previous, current = s.previous, s.current
        elif s.end == start:
            previous = s.current
    hits, reset = p.hits, s is not None and bool(int(p.behavior) & _RESET)
    if reset:
        previous = current = hits = 0
    length = end - start
    budget = p.limit * length - previous * (end - now) - current * length
    available = max(0, budget // length)
    over = not reset and _status(hits, available)
    if hits > 0 and over:
        if int(p.behavior) & _DRAIN:
            current = max(current, p.limit)
    elif hits:
        current = max(0, current + hits)
    budget = p.limit * length - previous * (end - now) - current * length
    remaining = max(0, budget // length)
    state = SlidingWindowState(p.duration, gregorian, start, end, previous, current)
    return state, Outcome(over, p.limit, remaining, max(now, _sliding_full_at(state)))


def _sliding_full_at(s: SlidingWindowState) -> int:
    """When the estimate is back to zero: the end of the window the last hit still weighs."""
    if s.current:
        return calendar.window(s.end, s.duration)[1] if s.gregorian else s.end + s.duration
    return s.end if s.previous else s.start


# -- the seed's history rule ---------------------------------------------------------------


def _history(s: HistoryState | None, p: LimitParams, now: int) -> tuple[HistoryState, Outcome]:
    """The seed's rule: a hit is accepted while fewer than ``burst`` hits were accepted in
    the past ``burst / rate`` (``rate = limit / duration``). ``n`` hits are accepted
    together when ``recent + n <= burst`` and recorded as ``n`` timestamps ``now``. With
    DRAIN_OVER_LIMIT each refused hit is recorded as the seed records a delayed request,
    at ``max(now, last) + 1 / rate``. Negative hits drop the newest timestamps.
    """
    burst = p.burst or p.limit
    if burst <= 0 or p.limit <= 0:
        state = HistoryState(p.limit, p.duration, burst, ())
        return state, Outcome(p.hits >= 0, p.limit, 0, now)
    rule = _rule(p.limit, p.duration, burst)
    log: history.History = list(s.history) if s is not None else []
    hits, reset = p.hits, s is not None and bool(int(p.behavior) & _RESET)
    if reset:
        log.clear()
        hits = 0
    del log[: max(0, len(log) - burst)]
    available = burst - _recent(log, now, rule)
    over = not reset and _status(hits, available)
    if hits > 0 and over:
        if int(p.behavior) & _DRAIN:
            for _ in range(min(hits, burst)):
                delayed = history.next_allowed(log, now, rule)
                history.record(log, float(now) if delayed is None else delayed, rule)
    elif hits > 0:
        for _ in range(min(hits, burst)):
            history.record(log, float(now), rule)
    elif hits < 0:
        del log[max(0, len(log) + hits) :]
    state = HistoryState(p.limit, p.duration, burst, tuple(log))
    remaining = burst - _recent(log, now, rule)
    full_at = _ceil(history.expires_at(log, rule)) if log else now
    return state, Outcome(over, p.limit, remaining, max(now, full_at))


@lru_cache(maxsize=1024)
def _rule(limit: int, duration: int, burst: int) -> Rule:
    """The seed's rule for these params (rate per second), built once per distinct config."""
    return Rule(limit * 1000.0 / duration, burst)


def _recent(log: history.History, now: int, rule: Rule) -> int:
    horizon = now - rule.window_ms
    return sum(1 for ts in log if ts > horizon)
