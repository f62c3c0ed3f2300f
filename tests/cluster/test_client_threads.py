"""The thread Coalescer's chained wake-up: each answered waiter of a call wakes the next.
Many threads, calls that fail now and then: every check gets its own answer or its
call's error, none is lost or left waiting (each thread is joined with a bound)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from smockron.cluster.client import SECOND
from smockron.cluster.client._coalesce import Coalescer
from smockron.cluster.model import RateLimitRequest, RateLimitResponse, Status


def test_every_waiter_of_a_chain_gets_its_own_answer() -> None:
    calls: list[int] = []

    def call(reqs: Sequence[RateLimitRequest]) -> list[RateLimitResponse]:
        calls.append(len(reqs))
        time.sleep(0.002)  # a round trip: the others queue meanwhile
        if len(calls) % 3 == 0:
            raise RuntimeError(f"call {len(calls)} failed")
        return [RateLimitResponse(Status.UNDER_LIMIT, r.limit, int(r.unique_key), 0) for r in reqs]

    co = Coalescer(call)
    threads, rounds = 60, 20
    results: list[list[object]] = [[] for _ in range(threads)]
    start = threading.Barrier(threads)

    def worker(i: int) -> None:
        start.wait(5)
        for n in range(rounds):
            key = i * 1000 + n
            try:
                results[i].append(co.check(RateLimitRequest("n", str(key), 1, 5, SECOND)))
            except RuntimeError as exc:
                results[i].append(exc)

    pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for t in pool:
        t.start()
    deadline = time.monotonic() + 20
    for t in pool:
        t.join(max(deadline - time.monotonic(), 0))
    assert not any(t.is_alive() for t in pool), "a waiter was never woken"
    answered = failed = 0
    for i, got in enumerate(results):
        assert len(got) == rounds
        for n, item in enumerate(got):
            if isinstance(item, RuntimeError):
                failed += 1
            else:
                assert isinstance(item, RateLimitResponse)
                assert item.remaining == i * 1000 + n  # its own answer, not a neighbour's
                answered += 1
    assert answered and failed  # both kinds went through chains
    assert max(calls) > 1 and sum(calls) == threads * rounds
    assert len(calls) < threads * rounds  # coalesced
