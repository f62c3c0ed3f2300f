"""The owner's words about a GLOBAL key reach a non-owner in any order (its answers to
the non-owner's hits, its UpdatePeerGlobals broadcasts): an older one must never replace
a newer one, so a client reading ``remaining`` through a non-owner never sees it rise
within a window. Real nodes; every request carries ``created_at`` from the test's
clock, so no window ends during a run.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path

import grpc
import pytest

from smockron.cluster.model import Algorithm, Behavior, RateLimitRequest, RateLimitResponse, Status
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc
from smockron.cluster.replica import VERSION, ReplicaCache
from smockron.core.hashring import HashRing
from tests.cluster.test_cluster import Cluster, start_cluster

LIMIT = 1000
HITS = 10
RUNS = 40
"""Before the fix about half of such runs saw ``remaining`` rise at least once."""
TB = Algorithm.TOKEN_BUCKET
KEY = "n_k"


# -- the replica, exactly: words in every order ------------------------------------------


def said(remaining: int, version: int, owner: str = "a:1") -> RateLimitResponse:
    """The owner's word (its answer or broadcast status), stamped ``version``."""
    metadata = {"owner": owner, VERSION: str(version)} if version else {}
    return RateLimitResponse(Status.UNDER_LIMIT, 100, remaining, 60_000, metadata=metadata)


def spend(cache: ReplicaCache, hits: int = 1) -> int:
    """One request of ``hits`` through the replica: the remaining it answers."""
    req = RateLimitRequest("n", "k", hits, 100, 60_000, TB, Behavior.GLOBAL)
    answer = cache.answer(req, now=0)
    assert answer is not None and answer.response.status == Status.UNDER_LIMIT
    return answer.response.remaining


def test_an_older_word_never_replaces_a_newer_one() -> None:
    cache = ReplicaCache()
    cache.install(KEY, said(99, 10), TB, 60_000)
    assert [spend(cache) for _ in range(3)] == [98, 97, 96]
    cache.sending(KEY, 3)
    cache.confirm(KEY, 3, said(96, 12), TB, sent_at=0)  # the owner applied the 3 at 12
    cache.install(KEY, said(99, 11), TB, 60_000)  # its broadcast read at 11 lands late
    assert spend(cache) == 95


def test_a_word_landing_while_hits_fly_waits_for_them() -> None:
    """A broadcast read after the owner applied this node's hits counts them: installed
    before their answer lands, they would count twice, then once (a rise)."""
    cache = ReplicaCache()
    cache.install(KEY, said(99, 10), TB, 60_000)
    assert [spend(cache) for _ in range(3)] == [98, 97, 96]
    cache.sending(KEY, 3)
    cache.install(KEY, said(90, 13), TB, 60_000)  # 3 of ours and 6 of other nodes'
    assert spend(cache) == 95  # held back: the 3 are not counted twice
    cache.confirm(KEY, 3, said(93, 12), TB, sent_at=0)  # applied at 12, before the broadcast
    assert spend(cache) == 88  # the broadcast now: 90 - the 2 admitted since
    cache.sending(KEY, 2)
    cache.install(KEY, said(87, 14), TB, 60_000)  # not counting them (applied later)
    cache.confirm(KEY, 2, said(85, 15), TB, sent_at=0)
    assert spend(cache) == 84


def test_answers_landing_among_flights_wait_for_the_last() -> None:
    cache = ReplicaCache()
    cache.install(KEY, said(99, 10), TB, 60_000)
    seen = [spend(cache) for _ in range(2)]
    cache.sending(KEY, 2)
    seen += [spend(cache) for _ in range(2)]
    cache.sending(KEY, 2)
    # the owner applied the second sync first (97 at 11), then the first (95 at 12)
    cache.confirm(KEY, 2, said(95, 12), TB, sent_at=0)
    seen.append(spend(cache))
    cache.confirm(KEY, 2, said(97, 11), TB, sent_at=0)
    seen.append(spend(cache))
    assert seen == [98, 97, 96, 95, 94, 93]
    assert cache.get(KEY) is not None and cache.get(KEY).pending == 2  # type: ignore[union-attr]


def test_a_word_waits_for_two_landings_at_most() -> None:
    """Syncs that overlap without end (an owner slower than the sync wait) must not keep
    the other nodes' hits from this node."""
    cache = ReplicaCache()
    cache.install(KEY, said(99, 10), TB, 60_000)
    assert spend(cache) == 98
    cache.sending(KEY, 1)
    assert spend(cache) == 97
    cache.sending(KEY, 1)
    cache.install(KEY, said(60, 11), TB, 60_000)  # other nodes spent 39
    assert spend(cache) == 96
    cache.sending(KEY, 1)
    cache.confirm(KEY, 1, said(59, 12), TB, sent_at=0)
    assert spend(cache) == 95  # two syncs still in flight: the word waits
    cache.confirm(KEY, 1, said(58, 13), TB, sent_at=0)
    assert spend(cache) == 55  # waited for two landings: 58 - the 2 admitted since sent
    cache.confirm(KEY, 1, said(57, 14), TB, sent_at=0)
    assert spend(cache) == 54


def test_a_lost_sync_gives_back_its_hits_and_releases_the_held_word() -> None:
    cache = ReplicaCache()
    cache.install(KEY, said(99, 10), TB, 60_000)
    spend(cache, 5)
    cache.sending(KEY, 5)
    cache.install(KEY, said(80, 11), TB, 60_000)
    cache.confirm(KEY, 5, None, TB, sent_at=0)  # unknown to the owner as far as we know
    assert spend(cache) == 79


def test_unstamped_words_are_installed_as_they_come() -> None:
    """A Gubernator owner stamps nothing: its words replace each other in arrival order."""
    cache = ReplicaCache()
    cache.install(KEY, said(90, 0), TB, 60_000)
    cache.install(KEY, said(95, 0), TB, 60_000)
    assert spend(cache) == 94
    cache.sending(KEY, 1)
    cache.install(KEY, said(96, 0), TB, 60_000)
    cache.confirm(KEY, 1, said(97, 0), TB, sent_at=0)
    assert spend(cache) == 96


def test_a_new_owner_is_heard_whatever_its_stamps() -> None:
    """Stamps order one owner's words; after the ring changes, the new owner's clock may
    be behind the old one's."""
    cache = ReplicaCache()
    cache.install(KEY, said(90, 50, owner="a:1"), TB, 60_000)
    cache.install(KEY, said(70, 20, owner="b:1"), TB, 60_000)
    assert spend(cache) == 69


# -- real nodes ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp: Path = tmp_path_factory.mktemp("global_order")
    with start_cluster(tmp, "--global-sync-wait", "20ms") as cluster:
        yield cluster


def _run(cluster: Cluster, run: int, created_at: int, seed: int, side: int = -1) -> list[int]:
    """Ten single GLOBAL hits on a fresh key through one of its non-owners (``side``; by
    default one after the other), 0-30 ms apart: the ``remaining`` of each answer."""
    rng = random.Random(seed * 2 + side)
    key = f"order-{seed}-{run}"
    owner = HashRing(cluster.addresses).owner(f"t_{key}")
    via = [a for a in cluster.addresses if a != owner][run % 2 if side < 0 else side]
    item = pb.RateLimitReq(
        name="t",
        unique_key=key,
        hits=1,
        limit=LIMIT,
        duration=180_000,
        behavior=pb.GLOBAL,
        created_at=created_at,
    )
    seen: list[int] = []
    with grpc.insecure_channel(via) as channel:
        stub = gubernator_pb2_grpc.V1Stub(channel)  # type: ignore[no-untyped-call]
        for _ in range(HITS):
            resp = stub.GetRateLimits(pb.GetRateLimitsReq(requests=[item]), timeout=10)
            rl = resp.responses[0]
            assert (rl.error, rl.status) == ("", pb.UNDER_LIMIT)
            assert set(rl.metadata) == {"owner"}  # nothing of the peers' protocol leaks
            seen.append(rl.remaining)
            time.sleep(rng.uniform(0, 0.030))
    return seen


def test_remaining_never_rises_through_a_non_owner(nodes: Cluster) -> None:
    """One client per key, alone: each answer is one less than the one before it, or,
    when the owner answers slower than the syncs overlap (a loaded machine), a hit still
    in flight is counted twice until it lands (``replica._MAX_WAIT``): two less, then
    the same. Never more, never a rise, and every hit counted in the end."""
    seed = random.getrandbits(32)
    created_at = time.time_ns() // 1_000_000
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda r: _run(nodes, r, created_at, seed), range(RUNS)))
    bad = [
        seen
        for seen in runs
        if seen[0] != LIMIT - 1
        or seen[-1] != LIMIT - HITS
        or any(not 0 <= a - b <= 2 for a, b in pairwise(seen))
        or len(seen) != HITS
    ]
    assert bad == [], f"seed {seed}: {len(bad)} of {RUNS} runs: {bad[:5]}"


def test_remaining_never_rises_while_another_node_spends(nodes: Cluster) -> None:
    """Two clients on a key, each through its own non-owner: each sees the other's hits
    only take ``remaining`` down."""
    seed = random.getrandbits(32)
    created_at = time.time_ns() // 1_000_000
    jobs = [(run, side) for run in range(RUNS // 2) for side in (0, 1)]
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda job: _run(nodes, job[0], created_at, seed, job[1]), jobs))
    bad = [seen for seen in runs if any(b >= a for a, b in pairwise(seen))]
    assert bad == [], f"seed {seed}: {len(bad)} of {len(runs)} clients: {bad[:5]}"
    assert all(LIMIT - 2 * HITS <= seen[-1] <= LIMIT - HITS for seen in runs)
