"""The non-owner's GLOBAL replica, exactly, with an injected clock."""

from __future__ import annotations

from smockron.cluster.model import (
    Algorithm,
    Behavior,
    RateLimitRequest,
    RateLimitResponse,
    Status,
)
from smockron.cluster.replica import ReplicaCache

TB = Algorithm.TOKEN_BUCKET


def req(hits: int, behavior: Behavior = Behavior.GLOBAL, limit: int = 10) -> RateLimitRequest:
    return RateLimitRequest("n", "k", hits, limit, 1000, TB, behavior)


def owner_says(remaining: int, reset: int = 5000, limit: int = 10) -> RateLimitResponse:
    return RateLimitResponse(Status.UNDER_LIMIT, limit, remaining, reset)


def test_unknown_key_needs_the_owner() -> None:
    assert ReplicaCache().answer(req(1), now=0) is None


def test_admits_until_owner_state_minus_pending_is_used() -> None:
    cache = ReplicaCache()
    cache.install("n_k", owner_says(3), TB, 1000)
    got = [cache.answer(req(1), now=100) for _ in range(4)]
    assert [(a[0].status, a[0].remaining, a[1]) for a in got if a is not None] == [
        (Status.UNDER_LIMIT, 2, 1),
        (Status.UNDER_LIMIT, 1, 1),
        (Status.UNDER_LIMIT, 0, 1),
        (Status.OVER_LIMIT, 0, 0),
    ]
    # the owner confirms 3 hits and says 0 remain: still nothing to admit
    cache.confirm("n_k", 3, owner_says(0), TB)
    answer = cache.answer(req(1), now=200)
    assert answer is not None and answer[0].status == Status.OVER_LIMIT


def test_broadcast_keeps_unconfirmed_hits() -> None:
    cache = ReplicaCache()
    cache.install("n_k", owner_says(5), TB, 1000)
    cache.answer(req(2), now=0)
    cache.install("n_k", owner_says(4), TB, 1000)  # another node's hit, ours in flight
    answer = cache.answer(req(0), now=0)
    assert answer is not None and answer[0].remaining == 2


def test_lost_hits_are_released() -> None:
    cache = ReplicaCache()
    cache.install("n_k", owner_says(5), TB, 1000)
    cache.answer(req(2), now=0)
    cache.confirm("n_k", 2, None, TB)
    answer = cache.answer(req(0), now=0)
    assert answer is not None and answer[0].remaining == 5


def test_window_end_restores_the_limit() -> None:
    cache = ReplicaCache()
    cache.install("n_k", owner_says(0, reset=1000), TB, 1000)
    answer = cache.answer(req(1), now=1000)
    assert answer is not None
    resp, hits = answer
    assert (resp.status, resp.remaining, resp.reset_time, hits) == (Status.UNDER_LIMIT, 9, 2000, 1)


def test_drain_over_limit_takes_what_is_left() -> None:
    cache = ReplicaCache()
    cache.install("n_k", owner_says(3), TB, 1000)
    answer = cache.answer(req(5, Behavior.GLOBAL | Behavior.DRAIN_OVER_LIMIT), now=0)
    assert answer is not None
    resp, hits = answer
    assert (resp.status, resp.remaining, hits) == (Status.OVER_LIMIT, 0, 3)


def test_negative_hits_give_back_and_reset_goes_to_owner() -> None:
    cache = ReplicaCache()
    cache.install("n_k", owner_says(3), TB, 1000)
    answer = cache.answer(req(-2), now=0)
    assert answer is not None and answer[0].remaining == 5 and answer[1] == -2
    assert cache.answer(req(1, Behavior.GLOBAL | Behavior.RESET_REMAINING), now=0) is None
    other = RateLimitRequest("n", "k", 1, 10, 1000, Algorithm.LEAKY_BUCKET, Behavior.GLOBAL)
    assert cache.answer(other, now=0) is None


def test_bounded_size_and_errors_ignored() -> None:
    cache = ReplicaCache(max_keys=2)
    for key in ("a", "b", "c"):
        cache.install(key, owner_says(1), TB, 1000)
    assert len(cache) == 2 and "a" not in cache
    cache.install("d", RateLimitResponse(error="boom"), TB, 1000)
    assert "d" not in cache
