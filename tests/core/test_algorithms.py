"""Exact-oracle tests of smockron.core.algorithms with an injected clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from math import ceil, floor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smockron.core import calendar, history
from smockron.core.algorithms import (
    Algorithm,
    Behavior,
    LimitParams,
    Outcome,
    State,
    check,
    expire_at,
)
from smockron.core.rules import Rule
from smockron.errors import InvalidParams

TB, LB = Algorithm.TOKEN_BUCKET, Algorithm.LEAKY_BUCKET
SW, SH = Algorithm.SLIDING_WINDOW, Algorithm.SMOCKRON_HISTORY
GREG = Behavior.DURATION_IS_GREGORIAN
DRAIN = Behavior.DRAIN_OVER_LIMIT
RESET = Behavior.RESET_REMAINING
T0 = 1_700_000_000_000


def ms(*args: int) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp()) * 1000  # type: ignore[arg-type,misc]


class Key:
    """One key's state, driven through ``check`` like a limiter would."""

    def __init__(self) -> None:
        self.state: State | None = None

    def hit(
        self,
        now: int,
        hits: int = 1,
        limit: int = 10,
        duration: int = 1000,
        algorithm: Algorithm = TB,
        behavior: Behavior = Behavior.BATCHING,
        burst: int = 0,
    ) -> Outcome:
        params = LimitParams(hits, limit, duration, burst, algorithm, behavior)
        self.state, verdict = check(self.state, params, now)
        return verdict


# -- token bucket ------------------------------------------------------------------------


def test_token_bucket_basic_window() -> None:
    k = Key()
    assert k.hit(T0) == Outcome(False, 10, 9, T0 + 1000)
    assert k.hit(T0 + 10, hits=0) == Outcome(False, 10, 9, T0 + 1000)
    assert k.hit(T0 + 20, hits=9) == Outcome(False, 10, 0, T0 + 1000)
    assert k.hit(T0 + 30) == Outcome(True, 10, 0, T0 + 1000)
    # A query always fits (Gubernator's TestDrainOverLimit), even with nothing left.
    assert k.hit(T0 + 40, hits=0) == Outcome(False, 10, 0, T0 + 1000)
    assert k.hit(T0 + 999) == Outcome(True, 10, 0, T0 + 1000)
    # The window ends at reset_time: a fresh one starts with this hit.
    assert k.hit(T0 + 1000) == Outcome(False, 10, 9, T0 + 2000)


def test_token_bucket_over_limit_consumes_nothing_and_is_not_sticky() -> None:
    k = Key()
    assert k.hit(T0, hits=3) == Outcome(False, 10, 7, T0 + 1000)
    assert k.hit(T0 + 1, hits=8) == Outcome(True, 10, 7, T0 + 1000)
    # Gubernator would still say OVER_LIMIT here (its stored status is sticky).
    assert k.hit(T0 + 2, hits=7) == Outcome(False, 10, 0, T0 + 1000)


def test_token_bucket_first_request_over_limit() -> None:
    k = Key()
    assert k.hit(T0, hits=11) == Outcome(True, 10, 10, T0 + 1000)
    assert k.hit(T0 + 1, hits=10) == Outcome(False, 10, 0, T0 + 1000)


def test_token_bucket_drain_over_limit() -> None:
    k = Key()
    k.hit(T0, hits=3)
    assert k.hit(T0 + 1, hits=8, behavior=DRAIN) == Outcome(True, 10, 0, T0 + 1000)
    assert k.hit(T0 + 2) == Outcome(True, 10, 0, T0 + 1000)


def test_token_bucket_negative_hits_give_back_even_above_limit() -> None:
    # Gubernator's TestTokenBucketNegativeHits: limit 2, hits -1 -> 3, -1 -> 4, 4 -> 0, -1 -> 1.
    k = Key()
    got = [k.hit(T0, hits=h, limit=2).remaining for h in (-1, -1, 4, -1)]
    assert got == [3, 4, 0, 1]
    k = Key()
    k.hit(T0, hits=5)
    assert k.hit(T0 + 1, hits=-2) == Outcome(False, 10, 7, T0 + 1000)
    assert k.hit(T0 + 2, hits=-50) == Outcome(False, 10, 57, T0 + 1000)
    assert k.hit(T0 + 1000, hits=0).remaining == 10  # the next window starts at limit


def test_token_bucket_limit_change_moves_remaining_by_difference() -> None:
    k = Key()
    k.hit(T0, hits=4)  # 6 left of 10
    assert k.hit(T0 + 1, hits=0, limit=20) == Outcome(False, 20, 16, T0 + 1000)
    assert k.hit(T0 + 2, hits=0, limit=15) == Outcome(False, 15, 11, T0 + 1000)
    assert k.hit(T0 + 3, hits=0, limit=2) == Outcome(False, 2, 0, T0 + 1000)
    assert k.hit(T0 + 4, hits=1, limit=2) == Outcome(True, 2, 0, T0 + 1000)


def test_reset_remaining_refills_without_counting_the_request() -> None:
    # Gubernator's functional test: 99, 98, RESET -> 100, then 99.
    for algorithm in (TB, SW, SH):
        k = Key()
        seq = [k.hit(T0 + i, limit=100, algorithm=algorithm) for i in range(2)]
        assert [v.remaining for v in seq] == [99, 98]
        v = k.hit(T0 + 2, limit=100, algorithm=algorithm, behavior=RESET)
        assert (v.over_limit, v.remaining) == (False, 100), algorithm
        assert k.hit(T0 + 3, limit=100, algorithm=algorithm).remaining == 99
    # On a key never seen there is nothing to reset: the hit counts.
    assert Key().hit(T0, limit=100, behavior=RESET).remaining == 99
    # The leaky bucket refills, then applies the hits (Gubernator's leaky bucket does too).
    k = Key()
    k.hit(T0, hits=10, algorithm=LB)
    assert k.hit(T0 + 1, hits=3, algorithm=LB, behavior=RESET) == Outcome(False, 10, 7, T0 + 301)


def test_token_bucket_duration_change() -> None:
    k = Key()
    k.hit(T0, hits=4)
    # Longer duration: same window start, later end, remaining kept.
    assert k.hit(T0 + 500, hits=0, duration=5000) == Outcome(False, 10, 6, T0 + 5000)
    # Shorter duration that has already ended: a new window starts now.
    assert k.hit(T0 + 600, hits=1, duration=100) == Outcome(False, 10, 9, T0 + 700)


def test_token_bucket_gregorian_minute_and_expire_at() -> None:
    now = ms(2024, 3, 5, 11, 20, 10)
    k = Key()
    v = k.hit(now, duration=0, behavior=GREG)
    assert v == Outcome(False, 10, 9, ms(2024, 3, 5, 11, 21, 0))
    assert k.state is not None and expire_at(k.state) == ms(2024, 3, 5, 11, 21, 0)
    assert k.hit(ms(2024, 3, 5, 11, 21, 0), duration=0, behavior=GREG).remaining == 9


@pytest.mark.parametrize(
    ("now", "interval", "start", "end"),
    [
        (ms(2024, 2, 10, 5), 4, ms(2024, 2, 1), ms(2024, 3, 1)),  # leap February
        (ms(2023, 2, 10, 5), 4, ms(2023, 2, 1), ms(2023, 3, 1)),
        (ms(2024, 12, 31, 23, 59, 59), 4, ms(2024, 12, 1), ms(2025, 1, 1)),
        (ms(2024, 7, 4), 5, ms(2024, 1, 1), ms(2025, 1, 1)),
        (ms(2024, 1, 1), 5, ms(2024, 1, 1), ms(2025, 1, 1)),
        (ms(2024, 11, 24, 12), 3, ms(2024, 11, 18), ms(2024, 11, 25)),  # Sunday -> Monday
        (ms(2024, 11, 25), 3, ms(2024, 11, 25), ms(2024, 12, 2)),
        (ms(2024, 3, 5, 23, 59, 59) + 999, 2, ms(2024, 3, 5), ms(2024, 3, 6)),
        (ms(2024, 3, 5, 7, 30), 1, ms(2024, 3, 5, 7), ms(2024, 3, 5, 8)),
    ],
)
def test_calendar_windows(now: int, interval: int, start: int, end: int) -> None:
    assert calendar.window(now, interval) == (start, end)


def test_token_bucket_gregorian_month_resets_at_month_end() -> None:
    k = Key()

    def month(now: int, hits: int = 1) -> Outcome:
        return k.hit(now, hits, limit=3, duration=4, behavior=GREG)

    assert month(ms(2024, 2, 29, 23), 3) == Outcome(False, 3, 0, ms(2024, 3, 1))
    assert month(ms(2024, 2, 29, 23, 59, 59)).over_limit
    assert month(ms(2024, 3, 1)) == Outcome(False, 3, 2, ms(2024, 4, 1))


# -- leaky bucket ------------------------------------------------------------------------


def test_leaky_bucket_burst_defaults_to_limit_and_refills() -> None:
    k = Key()
    # 10 per 1000 ms: one token per 100 ms.
    assert k.hit(T0, hits=10, algorithm=LB) == Outcome(False, 10, 0, T0 + 1000)
    assert k.hit(T0 + 50, algorithm=LB) == Outcome(True, 10, 0, T0 + 1000)
    assert k.hit(T0 + 100, algorithm=LB) == Outcome(False, 10, 0, T0 + 1100)
    assert k.hit(T0 + 450, hits=0, algorithm=LB) == Outcome(False, 10, 3, T0 + 1100)


def test_leaky_bucket_burst_above_limit() -> None:
    k = Key()
    assert k.hit(T0, hits=15, algorithm=LB, burst=20) == Outcome(False, 10, 5, T0 + 1500)
    assert k.hit(T0, hits=6, algorithm=LB, burst=20).over_limit
    # Burst lowered to 10: what is left is clamped to it (5 stays 5; Gubernator clamps too).
    assert k.hit(T0, hits=0, algorithm=LB, burst=10) == Outcome(False, 10, 5, T0 + 500)
    assert k.hit(T0, hits=0, algorithm=LB, burst=4) == Outcome(False, 10, 4, T0 + 0)
    # Burst raised: more room by the difference (4 + 6 = 10 of 10).
    assert k.hit(T0, hits=0, algorithm=LB, burst=10) == Outcome(False, 10, 10, T0)


def test_gubernator_change_limit_sequence() -> None:
    """Gubernator's TestChangeLimit: the same key, limits changed between requests."""
    k = Key()
    got = [
        k.hit(T0, limit=lim, duration=9000, algorithm=alg).remaining
        for alg, lim in [
            (TB, 100),
            (TB, 100),
            (TB, 10),
            (TB, 10),
            (TB, 200),
            (LB, 100),
            (LB, 10),
            (LB, 10),
        ]
    ]
    assert got == [99, 98, 7, 6, 195, 99, 9, 8]


Step = tuple[int, int, bool, int]  # hits, expected remaining, expected over, then sleep ms
MINUTE_PLUS_100 = ms(2026, 1, 1, 12, 0, 0) + 100
# the steps both buckets take alike
DRAINED: list[Step] = [(0, 10, False, 0), (1, 9, False, 0), (100, 0, True, 0), (0, 0, False, 0)]
MORE_THAN_LEFT: list[Step] = [
    (1000, 1000, False, 0),
    (1500, 1000, True, 0),
    (500, 500, False, 0),
    (400, 100, False, 0),
    (100, 0, False, 0),
    (1, 0, True, 0),
]

GUBERNATOR_SEQUENCES: dict[str, tuple[LimitParams, int, list[Step]]] = {
    # name: (params with hits ignored, start time, steps), from Gubernator's functional_test.go
    "TestOverTheLimit": (
        LimitParams(0, 2, 9000),
        T0,
        [(1, 1, False, 0), (1, 0, False, 0), (1, 0, True, 0)],
    ),
    "TestTokenBucket": (
        LimitParams(0, 2, 5),
        T0,
        [(1, 1, False, 0), (1, 0, False, 100), (1, 1, False, 0)],
    ),
    "TestTokenBucketGregorian": (
        LimitParams(0, 60, 0, behavior=GREG),
        MINUTE_PLUS_100,
        [
            (1, 59, False, 0),
            (1, 58, False, 0),
            (58, 0, False, 0),
            (1, 0, True, 61_000),
            (0, 60, False, 0),
        ],
    ),
    "TestTokenBucketNegativeHits": (
        LimitParams(0, 2, 5),
        T0,
        [(-1, 3, False, 0), (-1, 4, False, 0), (4, 0, False, 0), (-1, 1, False, 0)],
    ),
    "TestDrainOverLimit/TOKEN_BUCKET": (LimitParams(0, 10, 30_000, behavior=DRAIN), T0, DRAINED),
    "TestDrainOverLimit/LEAKY_BUCKET": (
        LimitParams(0, 10, 30_000, algorithm=LB, behavior=DRAIN),
        T0,
        DRAINED,
    ),
    "TestTokenBucketRequestMoreThanAvailable": (LimitParams(0, 2000, 1000), T0, MORE_THAN_LEFT),
    "TestLeakyBucketRequestMoreThanAvailable": (
        LimitParams(0, 2000, 1000, algorithm=LB),
        T0,
        MORE_THAN_LEFT,
    ),
    "TestLeakyBucket": (
        LimitParams(0, 10, 30_000, algorithm=LB),
        T0,
        [
            (1, 9, False, 1000),
            (1, 8, False, 1000),
            (1, 7, False, 1500),
            (0, 8, False, 3000),
            (0, 9, False, 0),
            (9, 0, False, 0),
            (1, 0, True, 3000),
            (0, 1, False, 60_000),
            (0, 10, False, 60_000),
            (10, 0, False, 29_000),
            (9, 0, False, 3000),
            (1, 0, False, 1000),
        ],
    ),
    "TestLeakyBucketWithBurst": (
        LimitParams(0, 10, 30_000, burst=20, algorithm=LB),
        T0,
        [
            (1, 19, False, 1000),
            (1, 18, False, 1000),
            (1, 17, False, 1500),
            (0, 18, False, 3000),
            (0, 19, False, 0),
            (19, 0, False, 0),
            (1, 0, True, 3000),
            (0, 1, False, 60_000),
            (0, 20, False, 1000),
        ],
    ),
    "TestLeakyBucketGregorian": (
        LimitParams(0, 60, 0, algorithm=LB, behavior=GREG),
        MINUTE_PLUS_100,
        [(1, 59, False, 500), (1, 58, False, 1200), (1, 58, False, 0)],
    ),
    "TestLeakyBucketNegativeHits": (
        LimitParams(0, 10, 30_000, algorithm=LB),
        T0,
        [(1, 9, False, 0), (-1, 10, False, 0), (10, 0, False, 0), (-1, 1, False, 0)],
    ),
    "TestLeakyBucketDivBug": (
        LimitParams(0, 2000, 1000, algorithm=LB),
        T0,
        [(1, 1999, False, 0), (100, 1899, False, 0)],
    ),
}


@pytest.mark.parametrize("name", sorted(GUBERNATOR_SEQUENCES))
def test_gubernator_functional_sequences(name: str) -> None:
    """Remaining and status agree with Gubernator's own functional tests, step by step."""
    base, now, steps = GUBERNATOR_SEQUENCES[name]
    state: State | None = None
    for i, (hits, remaining, over, sleep) in enumerate(steps):
        params = LimitParams(
            hits, base.limit, base.duration, base.burst, base.algorithm, base.behavior
        )
        state, v = check(state, params, now)
        assert (v.remaining, v.over_limit) == (remaining, over), (name, i)
        assert v.limit == base.limit and v.reset_time != 0
        now += sleep


def test_leaky_bucket_first_request_over_burst_consumes_nothing() -> None:
    k = Key()
    assert k.hit(T0, hits=11, algorithm=LB) == Outcome(True, 10, 10, T0)
    assert k.hit(T0, hits=11, algorithm=LB, behavior=DRAIN) == Outcome(True, 10, 0, T0 + 1000)


def test_leaky_bucket_gregorian_rate_uses_calendar_length() -> None:
    k = Key()
    day = 86_400_000
    start = ms(2024, 3, 5)
    # 24 per day: one per hour; the bucket is reset at the end of the day.
    v = k.hit(start + 3_600_000, hits=24, limit=24, duration=2, algorithm=LB, behavior=GREG)
    assert v == Outcome(False, 24, 0, start + day)
    v = k.hit(start + 2 * 3_600_000, hits=0, limit=24, duration=2, algorithm=LB, behavior=GREG)
    assert v.remaining == 1
    v = k.hit(start + day, hits=0, limit=24, duration=2, algorithm=LB, behavior=GREG)
    assert v.remaining == 24


def test_leaky_bucket_gregorian_month_rate_uses_true_month_length() -> None:
    k = Key()
    # 29 per month in February 2024 (29 days): one token per day.
    feb1 = ms(2024, 2, 1)
    v = k.hit(feb1, hits=29, limit=29, duration=4, algorithm=LB, behavior=GREG)
    assert v == Outcome(False, 29, 0, ms(2024, 3, 1))
    v = k.hit(feb1 + 86_400_000 - 1, hits=1, limit=29, duration=4, algorithm=LB, behavior=GREG)
    assert v.over_limit
    v = k.hit(feb1 + 3 * 86_400_000, hits=0, limit=29, duration=4, algorithm=LB, behavior=GREG)
    assert v.remaining == 3
    # A year: 366 per year in 2024 is one per day too.
    y = Key()
    y.hit(ms(2024, 6, 1), hits=366, limit=366, duration=5, algorithm=LB, behavior=GREG)
    v = y.hit(ms(2024, 6, 3), hits=0, limit=366, duration=5, algorithm=LB, behavior=GREG)
    assert v.remaining == 2 and v.reset_time == ms(2025, 1, 1)


# -- sliding window ----------------------------------------------------------------------


def test_sliding_window_weighting() -> None:
    k = Key()
    base = 1_000_000  # a multiple of the 1000 ms window
    assert k.hit(base + 500, hits=10, algorithm=SW) == Outcome(False, 10, 0, base + 2000)
    # Next window, 25% in: previous weighs 0.75 -> estimate 7.5, remaining floor(2.5) = 2.
    assert k.hit(base + 1250, hits=3, algorithm=SW) == Outcome(True, 10, 2, base + 2000)
    assert k.hit(base + 1250, hits=2, algorithm=SW) == Outcome(False, 10, 0, base + 3000)
    # Two windows later everything has aged out.
    assert k.hit(base + 3000, hits=0, algorithm=SW) == Outcome(False, 10, 10, base + 3000)


# -- the seed's history rule -------------------------------------------------------------


def test_history_rule_matches_seed_module() -> None:
    k = Key()
    rule = Rule(rate=2.0, burst=3)  # limit 2 per 1000 ms, burst 3
    log: history.History = []
    for now in [0, 10, 20, 30, 600, 1200, 1500, 1600, 2100, 2101, 4000]:
        v = k.hit(T0 + now, limit=2, duration=1000, burst=3, algorithm=SH)
        allowed = history.next_allowed(log, T0 + now, rule) is None
        assert v.over_limit is not allowed
        if allowed:
            history.record(log, T0 + now, rule)


def test_history_drain_records_delayed_timestamp() -> None:
    k = Key()
    for _ in range(2):
        k.hit(T0, limit=2, duration=1000, algorithm=SH)
    v = k.hit(T0, limit=2, duration=1000, algorithm=SH, behavior=DRAIN)
    assert v.over_limit and v.remaining == 0
    # The delayed request sits at T0 + 500 ms, so the key is busy until T0 + 1500.
    assert k.state is not None and expire_at(k.state) == T0 + 1500


# -- validation and switching ------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (LimitParams(1, -1, 1000), "limit must be >= 0"),
        (LimitParams(1, 10, -5), "duration must be >= 0"),
        (LimitParams(1, 10, 1000, burst=-1), "burst must be >= 0"),
        (LimitParams(1, 10, 1000, algorithm=9), "invalid rate limit algorithm"),  # type: ignore[arg-type]
        (LimitParams(1, 10, 6, behavior=GREG), "not a valid gregorian interval"),
        (LimitParams(1, 10, 1, algorithm=SH, behavior=GREG), "does not support"),
        (LimitParams(1, 10_001, 1000, algorithm=SH), "must be <= 10000, got 10001"),
        (LimitParams(1, 10, 1000, burst=20_000, algorithm=SH), "got 20000"),
    ],
)
def test_invalid_params(params: LimitParams, message: str) -> None:
    with pytest.raises(InvalidParams, match=message):
        check(None, params, T0)


@pytest.mark.parametrize("algorithm", [TB, LB, SW, SH])
def test_duration_zero_remembers_nothing(algorithm: Algorithm) -> None:
    # Gubernator's TestMissingFields: duration 0 is no error, and the hit is under limit.
    k = Key()
    for _ in range(3):
        v = k.hit(T0, hits=1, limit=10, duration=0, algorithm=algorithm)
        assert v == Outcome(False, 10, 9, T0)
        assert k.state is not None and expire_at(k.state) == T0
    assert k.hit(T0, hits=11, limit=10, duration=0, algorithm=algorithm).over_limit


def test_switching_algorithm_starts_fresh() -> None:
    k = Key()
    k.hit(T0, hits=10)
    assert k.hit(T0 + 1, hits=1, algorithm=LB) == Outcome(False, 10, 9, T0 + 101)


def test_check_does_not_mutate_state() -> None:
    k = Key()
    k.hit(T0, hits=2, limit=5, algorithm=SH)
    before = k.state
    check(before, LimitParams(2, 5, 1000, algorithm=SH), T0 + 1)
    assert before == k.state


# -- property tests against brute-force oracles ------------------------------------------

steps = st.lists(st.tuples(st.integers(0, 400), st.integers(-3, 12)), min_size=1, max_size=40)
limits = st.integers(0, 12)
durations = st.integers(1, 2000)
drains = st.booleans()


@dataclass
class FixedWindowOracle:
    """Gubernator's token bucket as counts: hits accepted since the window began."""

    limit: int
    duration: int
    drain: bool
    start: int | None = None
    used: int = 0

    def hit(self, now: int, hits: int) -> Outcome:
        if self.start is None or now >= self.start + self.duration:
            self.start, self.used = now, 0
        left = self.limit - self.used
        over = hits > left
        if over:
            if self.drain:
                self.used = self.limit
        else:
            self.used += hits
        return Outcome(over, self.limit, self.limit - self.used, self.start + self.duration)


@dataclass
class LeakyOracle:
    """A bucket of exact rational tokens, refilled at limit/duration per ms."""

    limit: int
    duration: int
    burst: int
    drain: bool
    tokens: Fraction | None = None
    updated: int = 0

    def hit(self, now: int, hits: int) -> Outcome:
        rate = Fraction(self.limit, self.duration)
        if self.tokens is None:
            self.tokens = Fraction(self.burst)
        else:
            self.tokens = min(Fraction(self.burst), self.tokens + (now - self.updated) * rate)
        self.updated = now
        left = floor(self.tokens)
        over = hits > left
        if over:
            if self.drain:
                self.tokens = Fraction(0)
        elif hits:
            self.tokens = min(Fraction(self.burst), self.tokens - hits)
        missing = self.burst - self.tokens
        if missing <= 0:
            reset = now
        elif self.limit == 0:
            reset = now + self.duration
        else:
            reset = now + ceil(missing / rate)
        return Outcome(over, self.limit, floor(self.tokens), reset)


@settings(max_examples=150, deadline=None)
@given(limit=limits, duration=durations, burst=st.integers(0, 15), drain=drains, seq=steps)
def test_leaky_bucket_oracle(
    limit: int, duration: int, burst: int, drain: bool, seq: list[tuple[int, int]]
) -> None:
    oracle = LeakyOracle(limit, duration, burst or limit, drain)
    k, now = Key(), T0
    behavior = DRAIN if drain else Behavior.BATCHING
    for dt, hits in seq:
        now += dt
        assert k.hit(now, hits, limit, duration, LB, behavior, burst) == oracle.hit(now, hits)


@dataclass
class SlidingOracle:
    """Keeps every counted hit with its time; weights the previous window exactly."""

    limit: int
    duration: int
    drain: bool
    events: list[tuple[int, int]] = field(default_factory=list)

    def estimate(self, now: int) -> tuple[Fraction, int, int]:
        start = now - now % self.duration
        cur = sum(n for t, n in self.events if start <= t < start + self.duration)
        prev = sum(n for t, n in self.events if start - self.duration <= t < start)
        weight = Fraction(start + self.duration - now, self.duration)
        return prev * weight + cur, prev, cur

    def hit(self, now: int, hits: int) -> Outcome:
        est, _, cur = self.estimate(now)
        left = max(0, floor(self.limit - est))
        over = hits > left
        if over:
            if self.drain and cur < self.limit:
                self.events.append((now, self.limit - cur))
        elif hits:
            self.events.append((now, max(hits, -cur)))
        est, prev, cur = self.estimate(now)
        start = now - now % self.duration
        if cur:
            reset = start + 2 * self.duration
        elif prev:
            reset = start + self.duration
        else:
            reset = now
        return Outcome(over, self.limit, max(0, floor(self.limit - est)), reset)


@pytest.mark.parametrize(
    ("algorithm", "oracle_of"), [(TB, FixedWindowOracle), (SW, SlidingOracle)], ids=["TB", "SW"]
)
@settings(max_examples=150, deadline=None)
@given(limit=limits, duration=durations, drain=drains, seq=steps)
def test_window_oracle(
    algorithm: Algorithm,
    oracle_of: type[FixedWindowOracle | SlidingOracle],
    limit: int,
    duration: int,
    drain: bool,
    seq: list[tuple[int, int]],
) -> None:
    """The token bucket and the sliding window hit for hit as their oracles."""
    oracle, k, now = oracle_of(limit, duration, drain), Key(), T0
    behavior = DRAIN if drain else Behavior.BATCHING
    for dt, hits in seq:
        now += dt
        assert k.hit(now, hits, limit, duration, algorithm, behavior) == oracle.hit(now, hits)


@settings(max_examples=150, deadline=None)
@given(limit=st.integers(1, 10), duration=durations, burst=st.integers(0, 8), seq=steps)
def test_history_oracle(limit: int, duration: int, burst: int, seq: list[tuple[int, int]]) -> None:
    """Unbounded list of accepted timestamps; n hits fit when recent + n <= burst."""
    b = burst or limit
    window = Rule(limit * 1000.0 / duration, b).window_ms
    accepted: list[float] = []
    k, now = Key(), T0
    for dt, hits in seq:
        now += dt
        v = k.hit(now, hits, limit, duration, SH, Behavior.BATCHING, burst)
        recent = sum(1 for t in accepted if t > now - window)
        over = hits > b - recent
        if hits > 0 and not over:
            accepted += [float(now)] * hits
        elif hits < 0:
            del accepted[max(0, len(accepted) + hits) :]
        recent = sum(1 for t in accepted if t > now - window)
        assert (v.over_limit, v.remaining) == (over, b - recent)
        assert v.reset_time == max(now, ceil(max(accepted[-b:]) + window) if accepted else 0)


@settings(max_examples=150, deadline=None)
@given(
    algorithm=st.sampled_from([TB, LB, SW, SH]),
    limit=st.integers(1, 10),
    burst=st.integers(0, 12),
    duration=durations,
    seq=st.lists(
        st.tuples(
            st.integers(0, 400),
            st.integers(-3, 12),
            st.sampled_from([Behavior.BATCHING, DRAIN, RESET]),
        ),
        min_size=1,
        max_size=30,
    ),
    final_hits=st.integers(0, 12),
)
def test_state_past_expire_at_behaves_like_no_state(
    algorithm: Algorithm,
    limit: int,
    burst: int,
    duration: int,
    seq: list[tuple[int, int, Behavior]],
    final_hits: int,
) -> None:
    """What LocalLimiter relies on to drop keys: after expire_at, the state is inert."""
    k, now = Key(), T0
    for dt, hits, behavior in seq:
        now += dt
        k.hit(now, hits, limit, duration, algorithm, behavior, burst)
    assert k.state is not None
    later = max(now, expire_at(k.state))
    params = LimitParams(final_hits, limit, duration, burst, algorithm)
    assert check(k.state, params, later)[1] == check(None, params, later)[1]


@settings(max_examples=60, deadline=None)
@given(
    algorithm=st.sampled_from([TB, LB, SW]),
    interval=st.integers(0, 2),
    seq=st.lists(
        st.tuples(st.integers(0, 1_800_000), st.integers(-2, 30)), min_size=1, max_size=20
    ),
)
def test_calendar_state_past_expire_at_behaves_like_no_state(
    algorithm: Algorithm, interval: int, seq: list[tuple[int, int]]
) -> None:
    k, now = Key(), T0
    for dt, hits in seq:
        now += dt
        k.hit(now, hits, 20, interval, algorithm, GREG)
    assert k.state is not None
    later = max(now, expire_at(k.state))
    params = LimitParams(1, 20, interval, 0, algorithm, GREG)
    assert check(k.state, params, later)[1] == check(None, params, later)[1]


@settings(max_examples=300, deadline=None)
@given(
    now=st.integers(-(10**12), 4 * 10**12),
    interval=st.integers(0, 5),
)
def test_calendar_window_properties(now: int, interval: int) -> None:
    start, end = calendar.window(now, interval)
    assert start <= now < end
    assert calendar.window(end, interval)[0] == end  # windows tile the time line
    assert calendar.window(start - 1, interval)[1] == start
    begin = datetime.fromtimestamp(start / 1000, UTC)
    zero = {"second": 0, "microsecond": 0}
    expected = {
        0: zero,
        1: {**zero, "minute": 0},
        2: {**zero, "minute": 0, "hour": 0},
        3: {**zero, "minute": 0, "hour": 0},
        4: {**zero, "minute": 0, "hour": 0, "day": 1},
        5: {**zero, "minute": 0, "hour": 0, "day": 1, "month": 1},
    }[interval]
    assert all(getattr(begin, name) == value for name, value in expected.items())
    if interval == 3:
        assert begin.weekday() == 0 and end - start == 7 * 86_400_000


@settings(max_examples=300, deadline=None)
@given(now=st.integers(-(2**63), 2**63 - 1), interval=st.sampled_from([4, 5]))
def test_calendar_months_and_years_for_any_int64_moment(now: int, interval: int) -> None:
    """A client's created_at may be any int64 (Gubernator's Go time takes it): months and
    years are computed in integers, where datetime stops at year 9999; within datetime's
    range they are datetime's."""
    start, end = calendar.window(now, interval)
    assert start <= now < end
    assert calendar.window(end, interval)[0] == end
    assert calendar.window(start - 1, interval)[1] == start
    days = (end - start) // 86_400_000
    assert days in ((28, 29, 30, 31) if interval == 4 else (365, 366))
    try:
        moment = datetime.fromtimestamp(now // 1000, UTC)
    except (ValueError, OverflowError, OSError):
        return
    first = datetime(moment.year, moment.month if interval == 4 else 1, 1, tzinfo=UTC)
    assert start == int(first.timestamp()) * 1000


def test_sliding_window_gregorian_months_of_different_lengths() -> None:
    k = Key()

    def month(now: int, hits: int) -> Outcome:
        return k.hit(now, hits, limit=31, duration=4, algorithm=SW, behavior=GREG)

    # 31 hits in January fill it; on 1 March 00:00 (Feb has 29 days in 2024) the previous
    # window is February, which is empty.
    assert month(ms(2024, 1, 20), 31) == Outcome(False, 31, 0, ms(2024, 3, 1))
    # Halfway through February (14.5 of 29 days), January's 31 weigh 15.5: 15 left.
    assert month(ms(2024, 2, 15, 12), 0) == Outcome(False, 31, 15, ms(2024, 3, 1))
    assert month(ms(2024, 2, 15, 12), 16).over_limit
    assert month(ms(2024, 3, 1), 0) == Outcome(False, 31, 31, ms(2024, 3, 1))
