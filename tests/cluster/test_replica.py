"""The non-owner's GLOBAL replica, exactly, with an injected clock."""

from __future__ import annotations

from smockron.cluster.lending import ALLOWANCE, LOAN
from smockron.cluster.model import (
    Algorithm,
    Behavior,
    RateLimitRequest,
    RateLimitResponse,
    Status,
)
from smockron.cluster.replica import ReplicaCache

TB = Algorithm.TOKEN_BUCKET
UNDER, OVER = Status.UNDER_LIMIT, Status.OVER_LIMIT


def req(hits: int, behavior: Behavior = Behavior.GLOBAL, limit: int = 10) -> RateLimitRequest:
    return RateLimitRequest("n", "k", hits, limit, 1000, TB, behavior)


def owner_says(
    remaining: int,
    reset: int = 5000,
    limit: int = 10,
    allowance: int | None = None,
    loan: int = 1,
) -> RateLimitResponse:
    """The owner's answer; with ``allowance``, a grant numbered ``loan``."""
    metadata = {} if allowance is None else {ALLOWANCE: str(allowance), LOAN: str(loan)}
    return RateLimitResponse(UNDER, limit, remaining, reset, metadata=metadata)


def answers(cache: ReplicaCache, n: int, now: int, hits: int = 1) -> list[tuple[Status, int, int]]:
    got = [cache.answer(req(hits), now=now) for _ in range(n)]
    return [(a.response.status, a.response.remaining, a.hits) for a in got if a is not None]


def test_unknown_key_needs_the_owner() -> None:
    assert ReplicaCache().answer(req(1), now=0) is None


def test_admits_until_owner_state_minus_pending_is_used() -> None:
    cache = ReplicaCache()  # one node: the equal share is the whole remaining
    cache.install("n_k", owner_says(3), TB, 1000)
    assert answers(cache, 4, now=100) == [(UNDER, 2, 1), (UNDER, 1, 1), (UNDER, 0, 1), (OVER, 0, 0)]
    # the owner confirms 3 hits and says 0 remain: still nothing to admit
    cache.confirm("n_k", 3, owner_says(0), TB)
    answer = cache.answer(req(1), now=200)
    assert answer is not None and answer.response.status == OVER


def test_without_a_lease_a_node_spends_its_equal_share() -> None:
    cache = ReplicaCache(nodes=lambda: 3)
    cache.install("n_k", owner_says(10), TB, 1000)  # ceil(10 / 3) = 4
    assert answers(cache, 5, now=0) == [
        (UNDER, 9, 1),
        (UNDER, 8, 1),
        (UNDER, 7, 1),
        (UNDER, 6, 1),
        (OVER, 0, 0),
    ]


def test_the_lent_budget_bounds_admissions_and_pending_hits_count_against_it() -> None:
    cache = ReplicaCache(nodes=lambda: 3, lease_ms=500)
    cache.install("n_k", owner_says(60, limit=100), TB, 1000)
    for _ in range(2):
        cache.answer(req(1, limit=100), now=0)
    # 2 hits sent at 10; the owner applied them (58 left) and lends this node 20; one
    # more hit was admitted meanwhile, so 19 of the 20 are left
    cache.answer(req(1, limit=100), now=10)
    cache.confirm("n_k", 2, owner_says(58, limit=100, allowance=20), TB, sent_at=10)
    item = cache.get("n_k")
    assert item is not None and (item.pending, item.budget, item.lease_until) == (1, 19, 510)
    got = [cache.answer(req(1, limit=100), now=20) for _ in range(20)]
    assert [a.response.status for a in got if a] == [UNDER] * 19 + [OVER]
    last_admitted, refused = got[18], got[19]
    assert last_admitted is not None and last_admitted.response.remaining == 38  # 58 - 20
    assert refused is not None and (refused.response.remaining, refused.hits) == (0, 0)
    assert refused.urgent  # 38 left in all: more may be lent


def test_a_refusal_is_not_urgent_when_nothing_is_left_at_all() -> None:
    cache = ReplicaCache(lease_ms=500)
    cache.install("n_k", owner_says(1, allowance=1), TB, 1000, sent_at=0)
    admitted, refused = (cache.answer(req(1), now=1) for _ in range(2))
    assert admitted is not None and admitted.urgent  # budget 0 of limit 10
    assert refused is not None and refused.response.status == OVER and not refused.urgent


def test_urgent_when_under_a_tenth_of_the_limit_is_left_in_the_budget() -> None:
    cache = ReplicaCache(lease_ms=500)
    cache.install("n_k", owner_says(90, limit=100, allowance=12), TB, 1000, sent_at=0)
    urgent = [a.urgent for a in (cache.answer(req(1, limit=100), now=1) for _ in range(4)) if a]
    assert urgent == [False, False, True, True]  # budget 11, 10, 9, 8


def test_a_late_answer_does_not_replace_a_newer_grant() -> None:
    cache = ReplicaCache(lease_ms=500)
    cache.install("n_k", owner_says(50, allowance=7, loan=2), TB, 1000, sent_at=10)
    cache.install("n_k", owner_says(50, allowance=30, loan=1), TB, 1000, sent_at=20)
    item = cache.get("n_k")
    assert item is not None and (item.budget, item.lease_until, item.loan) == (7, 510, 2)


def test_an_answer_without_a_grant_ends_the_lease() -> None:
    cache = ReplicaCache(nodes=lambda: 2, lease_ms=500)
    cache.install("n_k", owner_says(50, allowance=7, loan=1), TB, 1000, sent_at=0)
    released = owner_says(50)
    released.metadata[LOAN] = "2"  # the owner holds nothing for this node now
    cache.install("n_k", released, TB, 1000, sent_at=30)
    item = cache.get("n_k")
    assert item is not None and (item.budget, item.lease_until) == (25, 0)
    cache.install("n_k", owner_says(40, allowance=9, loan=3), TB, 1000, sent_at=40)
    cache.install("n_k", owner_says(40), TB, 1000, sent_at=50)  # a Gubernator owner
    item = cache.get("n_k")
    assert item is not None and (item.budget, item.lease_until) == (20, 0)


def test_broadcast_updates_remaining_and_keeps_the_lease() -> None:
    cache = ReplicaCache(nodes=lambda: 3, lease_ms=500)
    cache.install("n_k", owner_says(9, allowance=2), TB, 1000, sent_at=0)
    cache.install("n_k", owner_says(8), TB, 1000)  # UpdatePeerGlobals: no sent_at
    item = cache.get("n_k")
    assert item is not None and (item.remaining, item.budget, item.lease_until) == (8, 2, 500)


def test_a_lapsed_lease_falls_back_to_an_equal_share() -> None:
    cache = ReplicaCache(nodes=lambda: 2, lease_ms=500)
    cache.install("n_k", owner_says(8, allowance=6), TB, 1000, sent_at=0)
    answer = cache.answer(req(1), now=500)  # the owner no longer holds the 6: ceil(8 / 2)
    assert answer is not None and (answer.response.remaining, answer.hits) == (7, 1)
    item = cache.get("n_k")
    assert item is not None and (item.budget, item.lease_until) == (3, 0)


def test_broadcast_keeps_unconfirmed_hits() -> None:
    cache = ReplicaCache()
    cache.install("n_k", owner_says(5), TB, 1000)
    cache.answer(req(2), now=0)
    cache.install("n_k", owner_says(4), TB, 1000)  # another node's hit, ours in flight
    answer = cache.answer(req(0), now=0)
    assert answer is not None and answer.response.remaining == 2


def test_lost_hits_are_released() -> None:
    cache = ReplicaCache()
    cache.install("n_k", owner_says(5), TB, 1000)
    cache.answer(req(2), now=0)
    cache.confirm("n_k", 2, None, TB)
    answer = cache.answer(req(0), now=0)
    assert answer is not None and answer.response.remaining == 5


def test_window_end_restores_the_limit_and_an_equal_share() -> None:
    cache = ReplicaCache(nodes=lambda: 2, lease_ms=5000)
    cache.install("n_k", owner_says(0, reset=1000, allowance=0), TB, 1000, sent_at=0)
    answer = cache.answer(req(1), now=1000)
    assert answer is not None
    resp, hits, _ = answer
    assert (resp.status, resp.remaining, resp.reset_time, hits) == (UNDER, 9, 2000, 1)
    item = cache.get("n_k")
    assert item is not None and (item.budget, item.lease_until) == (4, 0)  # ceil(10 / 2) - 1


def test_drain_over_limit_takes_what_is_left() -> None:
    cache = ReplicaCache()
    cache.install("n_k", owner_says(3), TB, 1000)
    answer = cache.answer(req(5, Behavior.GLOBAL | Behavior.DRAIN_OVER_LIMIT), now=0)
    assert answer is not None
    resp, hits, _ = answer
    assert (resp.status, resp.remaining, hits) == (OVER, 0, 3)


def test_negative_hits_give_back_and_reset_goes_to_owner() -> None:
    cache = ReplicaCache()
    cache.install("n_k", owner_says(3), TB, 1000)
    answer = cache.answer(req(-2), now=0)
    assert answer is not None and answer.response.remaining == 5 and answer.hits == -2
    assert cache.answer(req(1, Behavior.GLOBAL | Behavior.RESET_REMAINING), now=0) is None
    other = RateLimitRequest("n", "k", 1, 10, 1000, Algorithm.LEAKY_BUCKET, Behavior.GLOBAL)
    assert cache.answer(other, now=0) is None


def test_negative_hits_raise_remaining_as_the_owner_does() -> None:
    """Gubernator's TestGlobalNegativeHits: remaining 3 of a limit of 2, a give-back of
    one -> 4 (the token bucket has no ceiling until its window ends); the leaky bucket
    stops at its burst, the sliding window at its limit."""
    cache = ReplicaCache()
    cache.install("n_k", owner_says(3, limit=2), TB, 1000)
    answer = cache.answer(req(-1, limit=2), now=0)
    assert answer is not None
    assert (answer.response.status, answer.response.remaining, answer.hits) == (UNDER, 4, -1)
    for algorithm, burst, ceiling in (
        (Algorithm.LEAKY_BUCKET, 0, 10),
        (Algorithm.LEAKY_BUCKET, 12, 12),
        (Algorithm.SLIDING_WINDOW, 0, 10),
    ):
        cache = ReplicaCache()
        cache.install("n_k", owner_says(9), algorithm, 1000)
        give_back = RateLimitRequest("n", "k", -5, 10, 1000, algorithm, Behavior.GLOBAL, burst)
        answer = cache.answer(give_back, now=0)
        assert answer is not None and answer.response.remaining == ceiling, algorithm


def test_bounded_size_and_errors_ignored() -> None:
    cache = ReplicaCache(max_keys=2)
    for key in ("a", "b", "c"):
        cache.install(key, owner_says(1), TB, 1000)
    assert len(cache) == 2 and "a" not in cache
    cache.install("d", RateLimitResponse(error="boom"), TB, 1000)
    assert "d" not in cache
