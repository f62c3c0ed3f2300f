"""The Gubernator-compatible rate-limit algorithms, as pure functions.

``check(state, params, now_ms) -> (new_state, verdict)``: the state is an opaque value
(``None`` for a key never seen), never mutated, so the caller may keep it, copy it to a
peer (GLOBAL) or drop it after ``expire_at(state)``. Four algorithms:

* TOKEN_BUCKET (0): Gubernator's, which is a fixed window: ``limit`` hits per window of
  ``duration`` ms starting at the first hit; remaining returns to ``limit`` when it ends.
* LEAKY_BUCKET (1): a bucket of ``burst`` (default ``limit``) tokens refilling
  continuously at ``limit`` per ``duration``. Kept in exact integer units (one token is
  ``period`` units, ``limit`` units leak in per ms), so tests can use an exact oracle.
* SLIDING_WINDOW (2): the two-window weighted counter (see ``_sliding``).
* SMOCKRON_HISTORY (3): the seed's history rule with rate ``limit / duration`` and burst
  ``burst or limit``.

Shared rules: ``hits == 0`` is a query that consumes nothing; negative hits give tokens
back (never above the maximum); a request whose hits do not fit is OVER_LIMIT and
consumes nothing unless DRAIN_OVER_LIMIT, which empties what is left. Status belongs to
the request, not to the key: a later request that fits is UNDER_LIMIT (a query reports
OVER_LIMIT only while nothing at all is left). ``reset_time`` is when the key is back at
its full allowance. docs/algorithms.md lists every difference from Gubernator.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import TypeAlias

from smockron.core import calendar, history
from smockron.core.rules import Rule
from smockron.errors import SmockronError


class Algorithm(IntEnum):
    TOKEN_BUCKET = 0
    LEAKY_BUCKET = 1
    # smockron's additions, beyond Gubernator's enum
    SLIDING_WINDOW = 2
    SMOCKRON_HISTORY = 3


class Behavior(IntFlag):
    BATCHING = 0
    NO_BATCHING = 1
    GLOBAL = 2
    DURATION_IS_GREGORIAN = 4
    RESET_REMAINING = 8
    MULTI_REGION = 16
    DRAIN_OVER_LIMIT = 32


class InvalidParams(SmockronError, ValueError):
    """Parameters no algorithm can apply; the message becomes the item's ``error``."""


@dataclass(frozen=True, slots=True)
class LimitParams:
    hits: int
    limit: int
    duration: int
    burst: int = 0
    algorithm: Algorithm = Algorithm.TOKEN_BUCKET
    behavior: Behavior = Behavior.BATCHING


@dataclass(frozen=True, slots=True)
class Verdict:
    over_limit: bool
    limit: int
    remaining: int
    reset_time: int


@dataclass(frozen=True, slots=True)
class TokenBucketState:
    limit: int
    duration: int
    gregorian: bool
    remaining: int
    start: int
    """When the current window began (``created_at`` in Gubernator)."""
    end: int
    """When it ends (exclusive): remaining is back to ``limit`` from here on."""


@dataclass(frozen=True, slots=True)
class LeakyBucketState:
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


@dataclass(frozen=True, slots=True)
class SlidingWindowState:
    duration: int
    gregorian: bool
    start: int
    """Start of the current window."""
    end: int
    previous: int
    """Hits counted in the window before ``start``."""
    current: int
    """Hits counted in ``[start, end)``."""


@dataclass(frozen=True, slots=True)
class HistoryState:
    limit: int
    duration: int
    burst: int
    history: tuple[float, ...]


State: TypeAlias = TokenBucketState | LeakyBucketState | SlidingWindowState | HistoryState


def check(state: State | None, params: LimitParams, now_ms: int) -> tuple[State, Verdict]:
    """Apply ``params.hits`` at ``now_ms``; raises InvalidParams for unusable params."""
    _validate(params)
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
    rule = Rule(state.limit * 1000.0 / state.duration, state.burst)
    return _ceil(history.expires_at(state.history, rule))


# -- validation ---------------------------------------------------------------------------


def _validate(p: LimitParams) -> None:
    try:
        Algorithm(p.algorithm)
    except ValueError:
        raise InvalidParams(f"invalid rate limit algorithm '{p.algorithm}'") from None
    if p.limit < 0:
        raise InvalidParams(f"limit must be >= 0, got {p.limit}")
    if p.burst < 0:
        raise InvalidParams(f"burst must be >= 0, got {p.burst}")
    if p.behavior & Behavior.DURATION_IS_GREGORIAN:
        if not calendar.is_gregorian(p.duration):
            raise InvalidParams(
                "behavior DURATION_IS_GREGORIAN is set; but duration "
                f"{p.duration} is not a valid gregorian interval (0..5)"
            )
        if p.algorithm == Algorithm.SMOCKRON_HISTORY:
            raise InvalidParams("SMOCKRON_HISTORY does not support DURATION_IS_GREGORIAN")
    elif p.duration <= 0:
        raise InvalidParams(f"duration must be > 0 ms, got {p.duration}")


def _window(p: LimitParams, now: int, start: int) -> tuple[int, int]:
    """The window a fresh key (or a changed duration) gets: calendar, or from ``start``."""
    if p.behavior & Behavior.DURATION_IS_GREGORIAN:
        return calendar.window(now, p.duration)
    return start, start + p.duration


def _status(hits: int, available: int) -> bool:
    """Over limit? A query is over limit only when nothing at all is left."""
    return available <= 0 if hits == 0 else hits > available


def _ceil(x: float) -> int:
    n = int(x)
    return n + 1 if n < x else n


# -- token bucket (Gubernator's fixed window) ----------------------------------------------


def _token_bucket(
    s: TokenBucketState | None, p: LimitParams, now: int
) -> tuple[TokenBucketState, Verdict]:
    gregorian = bool(p.behavior & Behavior.DURATION_IS_GREGORIAN)
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
        if p.behavior & Behavior.RESET_REMAINING:
            remaining = p.limit
    hits = p.hits
    over = _status(hits, remaining)
    if hits > 0 and over:
        if p.behavior & Behavior.DRAIN_OVER_LIMIT:
            remaining = 0
    elif hits:
        remaining = min(p.limit, remaining - hits)
    state = TokenBucketState(p.limit, p.duration, gregorian, remaining, start, end)
    return state, Verdict(over, p.limit, remaining, end)


# -- leaky bucket --------------------------------------------------------------------------


def _leaky_bucket(
    s: LeakyBucketState | None, p: LimitParams, now: int
) -> tuple[LeakyBucketState, Verdict]:
    gregorian = bool(p.behavior & Behavior.DURATION_IS_GREGORIAN)
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
        if burst != s.burst:
            level += (burst - s.burst) * period
        level = max(0, min(burst * period, level))
        if p.behavior & Behavior.RESET_REMAINING:
            level = burst * period
    hits = p.hits
    over = _status(hits, level // period)
    if hits > 0 and over:
        if p.behavior & Behavior.DRAIN_OVER_LIMIT:
            level = 0
    elif hits:
        level = min(burst * period, level - hits * period)
    updated = now if s is None else max(now, s.updated)
    state = LeakyBucketState(
        p.limit, p.duration, gregorian, burst, period, level, updated, window_end
    )
    return state, Verdict(over, p.limit, level // period, _leaky_full_at(state))


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
) -> tuple[SlidingWindowState, Verdict]:
    """Two-window weighted counter.

    Windows are aligned to the epoch (``k * duration``) or to the calendar. With ``c``
    hits counted in the current window ``[start, end)`` and ``q`` in the one before, the
    estimate at ``now`` is ``q * (end - now) / (end - start) + c``; a request fits when
    estimate + hits <= limit, and remaining is ``floor(limit - estimate)``. All integer.
    """
    gregorian = bool(p.behavior & Behavior.DURATION_IS_GREGORIAN)
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
    if p.behavior & Behavior.RESET_REMAINING:
        previous = current = 0
    length = end - start
    budget = p.limit * length - previous * (end - now) - current * length
    available = max(0, budget // length)
    hits = p.hits
    over = _status(hits, available)
    if hits > 0 and over:
        if p.behavior & Behavior.DRAIN_OVER_LIMIT:
            current = max(current, p.limit)
    elif hits:
        current = max(0, current + hits)
    budget = p.limit * length - previous * (end - now) - current * length
    remaining = max(0, budget // length)
    state = SlidingWindowState(p.duration, gregorian, start, end, previous, current)
    return state, Verdict(over, p.limit, remaining, max(now, _sliding_full_at(state)))


def _sliding_full_at(s: SlidingWindowState) -> int:
    """When the estimate is back to zero: the end of the window the last hit still weighs."""
    if s.current:
        return calendar.window(s.end, s.duration)[1] if s.gregorian else s.end + s.duration
    return s.end if s.previous else s.start


# -- the seed's history rule ---------------------------------------------------------------


def _history(s: HistoryState | None, p: LimitParams, now: int) -> tuple[HistoryState, Verdict]:
    """The seed's rule: a hit is accepted while fewer than ``burst`` hits were accepted in
    the past ``burst / rate`` (``rate = limit / duration``). ``n`` hits are accepted
    together when ``recent + n <= burst`` and recorded as ``n`` timestamps ``now``. With
    DRAIN_OVER_LIMIT each refused hit is recorded as the seed records a delayed request,
    at ``max(now, last) + 1 / rate``. Negative hits drop the newest timestamps.
    """
    burst = p.burst or p.limit
    if burst <= 0 or p.limit <= 0:
        state = HistoryState(p.limit, p.duration, burst, ())
        return state, Verdict(p.hits >= 0, p.limit, 0, now)
    rule = Rule(p.limit * 1000.0 / p.duration, burst)
    log: history.History = list(s.history) if s is not None else []
    if p.behavior & Behavior.RESET_REMAINING:
        log.clear()
    del log[: max(0, len(log) - burst)]
    available = burst - _recent(log, now, rule)
    hits = p.hits
    over = _status(hits, available)
    if hits > 0 and over:
        if p.behavior & Behavior.DRAIN_OVER_LIMIT:
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
    return state, Verdict(over, p.limit, remaining, max(now, expire_at(state)))


def _recent(log: history.History, now: int, rule: Rule) -> int:
    horizon = now - rule.window_ms
    return sum(1 for ts in log if ts > horizon)
