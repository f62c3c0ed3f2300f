from __future__ import annotations

import gc
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smockron.cluster import local
from smockron.cluster.local import LocalLimiter, check_compiled, epoch_ms
from smockron.cluster.model import (
    Algorithm,
    Behavior,
    RateLimitRequest,
    RateLimitResponse,
    Status,
)
from smockron.core.algorithms import (
    HistoryState,
    LeakyBucketState,
    SlidingWindowState,
    State,
    TokenBucketState,
)

T0 = 1_700_000_000_000
OVER, UNDER = Status.OVER_LIMIT, Status.UNDER_LIMIT


@pytest.fixture(autouse=True, params=["compiled", "python"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test on both paths: the C one (when built) and the Python one."""
    if request.param == "python":
        if "compiled" in request.node.name:
            pytest.skip("compares the compiled path with the Python one itself")
        monkeypatch.setattr(local, "check_compiled", None)
    elif check_compiled is None:
        pytest.skip("_localfast is not built")
    return str(request.param)


class FakeClock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def req(
    key: str = "acct:1",
    hits: int = 1,
    limit: int = 3,
    duration: int = 1000,
    algorithm: int = Algorithm.TOKEN_BUCKET,
    behavior: Behavior = Behavior.BATCHING,
    created_at: int | None = None,
) -> RateLimitRequest:
    return RateLimitRequest(
        name="requests",
        unique_key=key,
        hits=hits,
        limit=limit,
        duration=duration,
        algorithm=algorithm,  # type: ignore[arg-type]  # bad values on purpose
        behavior=behavior,
        created_at=created_at,
    )


def test_token_bucket_through_the_limiter_with_injected_clock() -> None:
    clock = FakeClock()
    lim = LocalLimiter(clock=clock)
    got = [lim.check([req()])[0] for _ in range(4)]
    assert [r.status for r in got] == [UNDER, UNDER, UNDER, OVER]
    assert [r.remaining for r in got] == [2, 1, 0, 0]
    assert all(r.reset_time == T0 + 1000 and r.limit == 3 and r.error == "" for r in got)
    clock.now = T0 + 1000
    assert lim.check([req()])[0] == RateLimitResponse(UNDER, 3, 2, T0 + 2000)


def test_bad_items_get_their_own_error_and_order_is_kept() -> None:
    lim = LocalLimiter(clock=FakeClock())
    batch = [
        req("a"),
        req(""),
        RateLimitRequest(name="", unique_key="x", hits=1, limit=1, duration=10),
        req("b", limit=-1),
        req("c", duration=-5),
        req("d", algorithm=7),
        req("e", duration=9, behavior=Behavior.DURATION_IS_GREGORIAN),
        req("a"),
    ]
    out = lim.check(batch)
    assert [r.error for r in out] == [
        "",
        "field 'unique_key' cannot be empty",
        "field 'namespace' cannot be empty",
        "limit must be >= 0, got -1",
        "duration must be >= 0 ms, got -5",
        "invalid rate limit algorithm '7'",
        "behavior DURATION_IS_GREGORIAN is set; but `Duration` is not a valid gregorian"
        " interval: got 9 (0..5)",
        "",
    ]
    assert (out[0].remaining, out[7].remaining) == (2, 1)
    assert len(lim) == 1


def test_name_and_unique_key_form_the_key() -> None:
    lim = LocalLimiter(clock=FakeClock())
    a = RateLimitRequest(name="x", unique_key="1", hits=1, limit=5, duration=100)
    b = RateLimitRequest(name="y", unique_key="1", hits=1, limit=5, duration=100)
    assert [r.remaining for r in lim.check([a, a, b])] == [4, 3, 4]


def test_created_at_is_the_clock_for_that_item() -> None:
    lim = LocalLimiter(clock=FakeClock(T0 + 50_000))
    first = lim.check([req(created_at=T0)])[0]
    assert first.reset_time == T0 + 1000
    # Without created_at the limiter's clock applies: that window is long over.
    assert lim.check([req()])[0].reset_time == T0 + 51_000


@pytest.mark.parametrize(
    "algorithm", [Algorithm.TOKEN_BUCKET, Algorithm.LEAKY_BUCKET, Algorithm.SLIDING_WINDOW]
)
def test_calendar_request_beyond_year_9999_is_answered(algorithm: Algorithm) -> None:
    """A created_at far in the future (year 37648 here) with a calendar duration gets an
    answer, and the other items of its batch too (it used to raise out of the batch)."""
    lim = LocalLimiter(clock=FakeClock(T0))
    far = req(
        key="far",
        duration=4,
        algorithm=algorithm,
        behavior=Behavior.DURATION_IS_GREGORIAN,
        created_at=1_125_899_906_842_625,
    )
    answers = lim.check([far, req()])
    assert answers[0].status is UNDER and answers[0].error == ""
    assert answers[0].reset_time > 1_125_899_906_842_625
    assert answers[1].status is UNDER


@pytest.mark.parametrize("others", [0, 3])
def test_state_lives_until_created_at_plus_duration(others: int) -> None:
    """Gubernator's TestLeakyBucketDivBug with ``created_at`` 500 ms behind the node's
    clock: the first hit leaves a bucket that is full again 1 ms later, but Gubernator keeps
    the key until created_at + duration, so a second request at the same created_at finds
    it (1899, not 1900), whatever else is cached and swept first."""
    clock = FakeClock(T0 + 500)
    lim = LocalLimiter(clock=clock)
    lim.check([req(f"other{i}", duration=100, created_at=T0 - 1000) for i in range(others)])

    def div(hits: int) -> RateLimitRequest:
        return req("div", hits, 2000, 1000, Algorithm.LEAKY_BUCKET, created_at=T0)

    assert lim.check([div(1)])[0].remaining == 1999
    assert lim.check([div(100)])[0].remaining == 1899
    clock.now = T0 + 1000
    lim.check([])
    assert len(lim) == 0  # swept once created_at + duration has passed on the node's clock


def test_now_ms_overrides_the_clock() -> None:
    lim = LocalLimiter(clock=FakeClock())
    assert lim.check([req()], now_ms=T0 + 5)[0].reset_time == T0 + 1005


def test_expired_keys_are_swept() -> None:
    clock = FakeClock()
    lim = LocalLimiter(clock=clock)
    lim.check([req(f"k{i}", duration=100) for i in range(5)])
    assert len(lim) == 5
    clock.now = T0 + 100
    lim.check([])
    assert len(lim) == 0


def test_lru_bound_evicts_least_recently_used() -> None:
    clock = FakeClock()
    lim = LocalLimiter(clock=clock, max_keys=3)
    for key in ["a", "b", "c"]:
        lim.check([req(key, hits=3)])
    lim.check([req("a", hits=0)])  # touch a: b is now the coldest
    lim.check([req("d", hits=3)])
    assert len(lim) == 3
    assert lim.get_state("requests_b") is None
    assert lim.check([req("b", hits=0)])[0].remaining == 3  # forgotten: full again
    assert lim.check([req("a", hits=0)])[0].remaining == 0


def test_counters_of_hits_misses_over_limit_and_evictions() -> None:
    """What /metrics exports as Gubernator's cache and over-limit counters, on both paths."""
    clock = FakeClock()
    lim = LocalLimiter(clock=clock, max_keys=2)
    assert lim.stats() == dict.fromkeys(local.STATS, 0)
    lim.check([req("a", limit=1), req("a", limit=1), req("b"), req("a", limit=1, hits=0)])
    # a: a miss, then a hit over the limit, then a hit (zero hits is never over)
    assert lim.stats() == {
        "over_limit": 1,
        "hit": 2,
        "miss": 2,
        "unexpired_evictions": 0,
        "invalid": 0,
    }
    lim.check([req("c")])  # a third live key: the least recently used (b) goes, unexpired
    assert lim.stats()["unexpired_evictions"] == 1
    clock.now += 10_000  # a and c expired: b misses, and so does d; they evict a and c,
    lim.check([req("b"), req("d")])  # which are not counted
    assert lim.stats() == {
        "over_limit": 1,
        "hit": 2,
        "miss": 5,
        "unexpired_evictions": 1,
        "invalid": 0,
    }
    bad = [
        RateLimitRequest(name="requests", unique_key="", hits=1, limit=1, duration=1000),
        req(limit=-1),
    ]
    assert all(r.error for r in lim.check(bad))
    assert lim.stats()["invalid"] == 2


def test_get_and_set_state_replicate_a_key() -> None:
    clock = FakeClock()
    owner, replica = LocalLimiter(clock=clock), LocalLimiter(clock=clock)
    owner.check([req(hits=2, algorithm=Algorithm.LEAKY_BUCKET)])
    state = owner.get_state("requests_acct:1")
    assert state is not None
    replica.set_state("requests_acct:1", state)
    got = replica.check([req(hits=0, algorithm=Algorithm.LEAKY_BUCKET)])[0]
    assert (got.status, got.remaining) == (UNDER, 1)
    clock.now = T0 + 10_000
    assert owner.get_state("requests_acct:1") is None


async def test_get_rate_limits_is_the_async_face() -> None:
    lim = LocalLimiter(clock=FakeClock())
    out = await lim.get_rate_limits([req(hits=4), req(hits=3)])
    assert [(r.status, r.remaining) for r in out] == [(OVER, 3), (UNDER, 0)]


def test_threads_never_over_admit() -> None:
    lim = LocalLimiter()
    admitted: list[int] = []

    def worker() -> None:
        ok = sum(
            lim.check([req("shared", limit=500, duration=60_000)])[0].status == UNDER
            for _ in range(300)
        )
        admitted.append(ok)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sum(admitted) == 500


def test_invalid_max_keys_and_clock() -> None:
    with pytest.raises(ValueError, match="max_keys"):
        LocalLimiter(max_keys=0)
    assert abs(epoch_ms() - LocalLimiter()._clock()) < 1000


def test_cached_states_are_invisible_to_the_garbage_collector() -> None:
    """Every algorithm's state is cached as plain tuples of numbers, which CPython's
    collector stops tracking: a full collection skips a million keys instead of
    walking them. The states still come back whole (GLOBAL reads them)."""
    limiter = LocalLimiter(FakeClock())
    kinds = {
        Algorithm.TOKEN_BUCKET: TokenBucketState,
        Algorithm.LEAKY_BUCKET: LeakyBucketState,
        Algorithm.SLIDING_WINDOW: SlidingWindowState,
        Algorithm.SMOCKRON_HISTORY: HistoryState,
    }
    assert set(kinds) == set(Algorithm)
    for _ in range(2):
        limiter.check([req(f"k{int(a)}", algorithm=a) for a in kinds])
    gc.collect()
    gc.collect()  # one pass per level: a history's timestamps are a tuple in the entry
    entries = list(limiter._cache.values())
    assert len(entries) == len(kinds)
    assert not any(gc.is_tracked(entry) for entry in entries)
    for a, kind in kinds.items():
        state = limiter.get_state(f"requests_k{int(a)}")
        assert type(state) is kind
    history = limiter.get_state(f"requests_k{int(Algorithm.SMOCKRON_HISTORY)}")
    assert isinstance(history, HistoryState) and history.history == (float(T0), float(T0))


# -- the compiled path (smockron.cluster._localfast) against the Python one --------------

compiled = pytest.mark.skipif(check_compiled is None, reason="_localfast is not built")
BIG = 1 << 30  # the compiled path's bound on limit, burst, duration and hits
numbers = st.sampled_from([0, 1, 2, 3, 5, 10, 1000, BIG - 1, BIG, BIG + 1])
odd_items = st.builds(
    RateLimitRequest,
    name=st.sampled_from(["n", "", "\u00f1"]),
    unique_key=st.sampled_from(["a", "b", "c", "\u20ac", ""]),
    hits=st.one_of(st.integers(-3, 12), numbers),
    limit=st.one_of(st.integers(0, 12), numbers),
    duration=st.one_of(st.integers(0, 2000), numbers),
    algorithm=st.sampled_from([*Algorithm, 7]),
    behavior=st.sampled_from(
        [Behavior.BATCHING, Behavior.GLOBAL | Behavior.NO_BATCHING, Behavior.MULTI_REGION]
        + [Behavior(b) for b in (4, 8, 32, 8 | 32, 4 | 32)]
    ),
    burst=st.one_of(st.integers(0, 15), numbers),
    created_at=st.sampled_from([None, 0, T0 - 700, T0 + 3000, -5, (1 << 50) + 1]),
).filter(  # calendar windows end at year 9999: an error in both paths
    lambda r: not (r.behavior & Behavior.DURATION_IS_GREGORIAN and (r.created_at or 0) > T0)
)
common_items = st.builds(  # what the compiled path answers, keeping states between calls
    RateLimitRequest,
    name=st.just("n"),
    unique_key=st.sampled_from(["a", "b", "c", "\u20ac"]),
    hits=st.integers(0, 4),
    limit=st.sampled_from([0, 3, 5]),
    duration=st.sampled_from([1, 7, 500, 1000]),
    algorithm=st.sampled_from(Algorithm),
    behavior=st.sampled_from([Behavior.BATCHING, Behavior.GLOBAL]),
    burst=st.sampled_from([0, 0, 2, 8]),
    created_at=st.sampled_from([None, None, None, T0 - 700, T0 + 3000]),
)
items = st.one_of(common_items, common_items, common_items, odd_items)
batches = st.lists(
    st.tuples(st.integers(-300, 2500), st.lists(items, max_size=6)), min_size=1, max_size=25
)


@compiled
@settings(max_examples=400, deadline=None)
@given(max_keys=st.sampled_from([2, 4, 1000]), seq=batches)
def test_compiled_and_python_checks_agree(
    max_keys: int, seq: list[tuple[int, list[RateLimitRequest]]]
) -> None:
    """Random batches (every algorithm, behavior, hits sign, changed params, created_at,
    clock jumps back and forth, LRU eviction, numbers around the compiled bounds): the
    same responses, the same cache entries in the same order."""
    fast, pure = LocalLimiter(max_keys=max_keys), LocalLimiter(max_keys=max_keys)
    pure._compiled = None
    now = T0
    for step, batch in seq:
        now += step
        assert fast.check(batch, now) == pure.check(batch, now)
        assert list(fast._cache.items()) == list(pure._cache.items())


@compiled
def test_compiled_path_answers_replicated_and_odd_states() -> None:
    """A state installed by set_state (GLOBAL) with values outside the compiled bounds, or
    of another algorithm, is handled exactly as in Python."""
    fast, pure = LocalLimiter(FakeClock()), LocalLimiter(FakeClock())
    pure._compiled = None
    odd: list[State] = [
        TokenBucketState(3, 1000, False, -(1 << 60), T0, T0 + 1000),
        LeakyBucketState(3, 1000, False, 3, 1000, 5000, T0, None),
        SlidingWindowState(1000, False, T0, T0 + 1000, 1 << 40, 2),
        HistoryState(3, 1000, 3, (float(T0), 1e300)),
        HistoryState(3, 1000, 3, (float(T0), float("nan"))),
        HistoryState(5, 1000, 5, (float(T0 - 999), float(T0 - 500), float(T0), float(T0))),
    ]
    for state in odd:
        for a in Algorithm:
            for lim in (fast, pure):
                lim.set_state("requests_acct:1", state)
            batch = [req(algorithm=a), req(hits=0, algorithm=a)]
            assert fast.check(batch) == pure.check(batch)
            assert list(fast._cache.items()) == list(pure._cache.items())


@compiled
def test_compiled_entries_are_untracked_from_the_start() -> None:
    """No collection needed: the C path writes entries the collector never sees."""
    limiter = LocalLimiter(FakeClock())
    limiter.check([req(f"k{int(a)}", algorithm=a) for a in Algorithm])
    assert len(limiter) == len(Algorithm)
    for entry in limiter._cache.values():
        assert not gc.is_tracked(entry)
        assert not any(gc.is_tracked(field) for field in entry)
