"""The forward batcher on a real event loop: size and time triggers, failures."""

from __future__ import annotations

import asyncio

import pytest

from smockron.cluster.batching import Batcher


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[int]] = []
        self.fail = fail

    async def send(self, items: list[int]) -> list[int]:
        self.calls.append(items)
        if self.fail:
            raise ConnectionError("peer gone")
        return [i * 10 for i in items]


async def test_items_submitted_together_travel_in_one_call() -> None:
    rec = Recorder()
    batcher: Batcher[int, int] = Batcher(rec.send, wait=0.0005, limit=1000)
    futures = [batcher.submit(i) for i in range(5)]
    assert await asyncio.gather(*futures) == [0, 10, 20, 30, 40]
    assert rec.calls == [[0, 1, 2, 3, 4]]


async def test_limit_sends_early_without_waiting() -> None:
    rec = Recorder()
    batcher: Batcher[int, int] = Batcher(rec.send, wait=10.0, limit=3)
    futures = [batcher.submit(i) for i in range(7)]
    done = await asyncio.wait_for(asyncio.gather(*futures[:6]), 1.0)
    assert done == [0, 10, 20, 30, 40, 50]
    assert rec.calls == [[0, 1, 2], [3, 4, 5]]
    await batcher.close()
    assert await futures[6] == 60
    assert rec.calls[-1] == [6]


async def test_an_idle_peer_gets_an_item_without_the_wait() -> None:
    rec = Recorder()
    batcher: Batcher[int, int] = Batcher(rec.send, wait=3600.0, limit=100)
    future = batcher.submit(1)
    for _ in range(3):  # the next turns of the loop, not the hour
        await asyncio.sleep(0)
    assert rec.calls == [[1]] and future.done() and future.result() == 10


async def test_wait_sends_a_partial_batch_while_a_call_is_in_flight() -> None:
    release = asyncio.Event()
    calls: list[list[int]] = []

    async def send(items: list[int]) -> list[int]:
        calls.append(items)
        if len(calls) == 1:
            await release.wait()
        return [i * 10 for i in items]

    batcher: Batcher[int, int] = Batcher(send, wait=0.01, limit=100)
    first = batcher.submit(1)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert calls == [[1]]  # in flight until released
    loop = asyncio.get_running_loop()
    start = loop.time()
    later = [batcher.submit(2), batcher.submit(3)]
    assert await asyncio.gather(*later) == [20, 30]
    assert loop.time() - start >= 0.009  # they waited for company, and went together
    assert calls == [[1], [2, 3]]
    release.set()
    assert await first == 10


async def test_failure_reaches_every_waiter() -> None:
    batcher: Batcher[int, int] = Batcher(Recorder(fail=True).send, wait=0.0005, limit=10)
    futures = [batcher.submit(i) for i in range(3)]
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)


async def test_short_answer_is_an_error() -> None:
    async def short(items: list[int]) -> list[int]:
        return items[:1]

    batcher: Batcher[int, int] = Batcher(short, wait=0.0005, limit=10)
    futures = [batcher.submit(i) for i in range(2)]
    with pytest.raises(RuntimeError, match="answered 1 items for 2"):
        await futures[0]
    with pytest.raises(RuntimeError):
        await futures[1]
