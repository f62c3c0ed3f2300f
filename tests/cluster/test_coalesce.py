"""Concurrent checks of one process go in few GetRateLimits calls: against a real grpc.aio
server (``LimiterServicer`` over a LocalLimiter with a fixed clock: exact answers), and
the coalescers alone with a call that records its batches."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from smockron.cluster.client import SECOND, AsyncClient, Client, ClientUnavailable
from smockron.cluster.client._coalesce import MAX_COALESCED, AsyncCoalescer, Coalescer
from smockron.cluster.model import RateLimitRequest, RateLimitResponse, Status
from tests.cluster.test_client import LimiterServicer, ServerThread
from tests.cluster.test_client import server as server  # the fixture: a real grpc.aio server
from tests.support import free_ports


def _req(key: str) -> RateLimitRequest:
    return RateLimitRequest(name="n", unique_key=key, hits=1, limit=10, duration=SECOND)


def _answer(reqs: Sequence[RateLimitRequest]) -> list[RateLimitResponse]:
    return [RateLimitResponse(Status.UNDER_LIMIT, r.limit, len(r.unique_key), 0) for r in reqs]


async def test_async_concurrent_checks_share_calls(
    server: tuple[ServerThread, LimiterServicer],
) -> None:
    thread, servicer = server
    async with AsyncClient(thread.address, timeout=5) as client:
        got = await asyncio.gather(
            *(client.check("rps", "acct", 1, 1000, SECOND) for _ in range(100))
        )
        assert client.coalescer is not None and client.coalescer.calls <= 3
    assert sorted(r.remaining for r in got) == list(range(900, 1000))
    assert sum(servicer.call_sizes) == 100 and len(servicer.call_sizes) <= 3
    assert max(servicer.call_sizes) >= 50


def test_threads_share_calls_and_each_gets_its_own_answer(
    server: tuple[ServerThread, LimiterServicer],
) -> None:
    thread, servicer = server
    with Client(thread.address, timeout=5) as client, ThreadPoolExecutor(32) as pool:
        got = list(
            pool.map(lambda i: client.check("rps", f"k{i % 8}", 1, 1000, SECOND), range(320))
        )
        assert client.coalescer is not None
        calls = client.coalescer.calls
    # each key counted down exactly once per check: 40 checks of each of 8 keys
    for k in range(8):
        mine = sorted(r.remaining for i, r in enumerate(got) if i % 8 == k)
        assert mine == list(range(960, 1000))
    assert sum(servicer.call_sizes) == 320 and calls == len(servicer.call_sizes) < 320


def test_a_lone_check_goes_at_once_and_a_timeout_goes_alone(
    server: tuple[ServerThread, LimiterServicer],
) -> None:
    thread, servicer = server
    with Client(thread.address) as client:
        client.check("rps", "a", 1, 5, SECOND)
        client.check("rps", "a", 1, 5, SECOND, timeout=1)
        assert client.coalescer is not None and client.coalescer.calls == 1
    assert servicer.call_sizes == [1, 1]


async def test_every_waiter_gets_the_calls_error() -> None:
    async with AsyncClient(f"127.0.0.1:{free_ports(1)[0]}", timeout=0.5) as client:
        got = await asyncio.gather(
            *(client.check("n", f"k{i}", 1, 5, SECOND) for i in range(10)), return_exceptions=True
        )
    assert all(isinstance(e, ClientUnavailable) for e in got), got


async def test_async_coalescer_batches_while_a_call_is_in_flight() -> None:
    sizes: list[int] = []

    async def call(reqs: Sequence[RateLimitRequest]) -> list[RateLimitResponse]:
        sizes.append(len(reqs))
        await asyncio.sleep(0.01)
        return _answer(reqs)

    co = AsyncCoalescer(call)
    first = asyncio.ensure_future(co.check(_req("x")))
    await asyncio.sleep(0)  # the first call is in flight
    rest = await asyncio.gather(*(co.check(_req("y" * (i + 1))) for i in range(1500)))
    assert (await first).remaining == 1
    assert [r.remaining for r in rest] == list(range(1, 1501))  # each its own answer
    assert sizes == [1, MAX_COALESCED, 500]


async def test_async_coalescer_survives_a_cancelled_waiter() -> None:
    async def call(reqs: Sequence[RateLimitRequest]) -> list[RateLimitResponse]:
        await asyncio.sleep(0.01)
        return _answer(reqs)

    co = AsyncCoalescer(call)
    doomed = asyncio.ensure_future(co.check(_req("a")))
    kept = asyncio.ensure_future(co.check(_req("bb")))
    await asyncio.sleep(0)
    doomed.cancel()
    assert (await kept).remaining == 2
    with pytest.raises(asyncio.CancelledError):
        await doomed


def test_thread_coalescer_hands_over_and_delivers_errors() -> None:
    sizes: list[int] = []
    gate = threading.Event()

    def call(reqs: Sequence[RateLimitRequest]) -> list[RateLimitResponse]:
        sizes.append(len(reqs))
        if len(sizes) == 1:
            gate.wait(5)  # hold the first call until the others are queued
        if any(r.unique_key == "boom" for r in reqs):
            raise RuntimeError("boom")
        return _answer(reqs)

    co = Coalescer(call)
    with ThreadPoolExecutor(9) as pool:
        first = pool.submit(co.check, _req("x"))
        while not sizes:
            threading.Event().wait(0.001)
        others = [pool.submit(co.check, _req("y" * (i + 1))) for i in range(8)]
        while len(co._queue) < 8:
            threading.Event().wait(0.001)
        gate.set()
        assert first.result(5).remaining == 1
        assert [f.result(5).remaining for f in others] == list(range(1, 9))
    assert sizes == [1, 8]
    with pytest.raises(RuntimeError, match="boom"):
        co.check(_req("boom"))
    assert co.check(_req("ok")).remaining == 2  # the coalescer goes on after an error
