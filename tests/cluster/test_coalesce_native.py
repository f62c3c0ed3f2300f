"""Threads' checks coalesced inside the native channel (``Channel.check``, the client's
``NativeCoalescer``): against real grpc.aio servers on loopback (test_client's
``LimiterServicer`` over a LocalLimiter with a fixed clock, so every answer is exact),
many threads at once. Every check gets its own answer or its call's error, and none is
left waiting (every thread is joined with a bound)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from smockron.cluster.client import (
    NATIVE_AVAILABLE,
    SECOND,
    Client,
    ClientError,
    ClientTimeout,
    ClientUnavailable,
    ItemError,
)
from smockron.cluster.client._coalesce import Coalescer, NativeCoalescer
from smockron.cluster.model import RateLimitResponse
from tests.cluster.test_client import LimiterServicer, ServerThread
from tests.support import free_ports, wait_for

pytestmark = pytest.mark.skipif(not NATIVE_AVAILABLE, reason="_nativeclient not built")


@dataclass
class GatedServicer(LimiterServicer):
    """Holds the first call until ``gate`` is set, so that the checks made meanwhile
    queue behind it; records each call's unique keys."""

    gate: threading.Event = field(default_factory=threading.Event)
    keys: list[list[str]] = field(default_factory=list)

    async def GetRateLimits(self, request: Any, context: Any) -> Any:
        self.keys.append([msg.unique_key for msg in request.requests])
        if len(self.keys) == 1:
            while not self.gate.is_set():
                await asyncio.sleep(0.005)
        return await super().GetRateLimits(request, context)


@pytest.fixture
def gated() -> Iterator[tuple[ServerThread, GatedServicer]]:
    servicer = GatedServicer()
    thread = ServerThread(servicer)
    yield thread, servicer
    thread.close()


def run_threads(n: int, target: Callable[[int], object], bound: float = 20) -> list[object]:
    """``target(i)`` on ``n`` threads started in order; its result or exception each."""
    out: list[object] = [None] * n

    def run(i: int) -> None:
        try:
            out[i] = target(i)
        except Exception as exc:  # collected and checked by the test
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + bound
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0))
    assert not any(t.is_alive() for t in threads), "a check was never answered"
    return out


def start_held(client: Client, servicer: GatedServicer, key: str = "first") -> threading.Thread:
    """A check whose call the server holds (until ``servicer.gate``): a call in flight."""
    thread = threading.Thread(target=client.check, args=("nc", key, 1, 10, SECOND), daemon=True)
    thread.start()
    wait_for(lambda: len(servicer.keys) == 1, 5)
    return thread


def test_each_thread_gets_its_own_answer(gated: tuple[ServerThread, GatedServicer]) -> None:
    thread, servicer = gated
    servicer.gate.set()
    barrier = threading.Barrier(40)
    with Client(thread.address, timeout=5) as client:
        assert isinstance(client.coalescer, NativeCoalescer)

        def worker(i: int) -> list[RateLimitResponse]:
            barrier.wait(5)
            return [client.check("nc", f"k{i}", 1, 100 + i, SECOND) for _ in range(10)]

        got = run_threads(40, worker)
        calls = client.coalescer.calls
    for i, answers in enumerate(got):
        assert isinstance(answers, list)
        # each thread's key counted down once per check, in its own order
        assert [(r.limit, r.remaining) for r in answers] == [
            (100 + i, 100 + i - n) for n in range(1, 11)
        ]
    assert sum(servicer.call_sizes) == 400
    assert calls == len(servicer.call_sizes) < 400 and max(servicer.call_sizes) > 1


def test_checks_made_meanwhile_go_together_at_most_1000_a_call(
    gated: tuple[ServerThread, GatedServicer],
) -> None:
    thread, servicer = gated
    with Client(thread.address, timeout=10) as client, ThreadPoolExecutor(1049) as pool:
        first = start_held(client, servicer)
        futures = [pool.submit(client.check, "nc", f"q{i}", 1, 10, SECOND) for i in range(1049)]
        time.sleep(1.0)  # every one of them queued behind the held call
        servicer.gate.set()
        first.join(5)
        got = [f.result(10) for f in futures]
    assert servicer.call_sizes == [1, 1000, 49]
    # the oldest went first: the queue's order is the order of arrival, each call's
    # answers reached their own callers
    assert sorted(servicer.keys[1] + servicer.keys[2]) == sorted(f"q{i}" for i in range(1049))
    assert all(r.remaining == 9 for r in got)


def test_a_lone_check_goes_at_once_alone(gated: tuple[ServerThread, GatedServicer]) -> None:
    thread, servicer = gated
    servicer.gate.set()
    with Client(thread.address) as client:
        assert [client.check("nc", "a", 1, 5, SECOND).remaining for _ in range(3)] == [4, 3, 2]
        assert client.coalescer is not None and client.coalescer.calls == 3
    assert servicer.call_sizes == [1, 1, 1]


def test_a_failed_call_fails_each_check_it_carried_and_no_other(
    gated: tuple[ServerThread, GatedServicer],
) -> None:
    """The next call's oldest check names ``short``: the server answers one response too
    few, so that whole call fails (INTERNAL); the held call and later checks are fine."""
    thread, servicer = gated
    with Client(thread.address, timeout=5) as client, ThreadPoolExecutor(21) as pool:
        first = start_held(client, servicer)
        short = pool.submit(client.check, "short", "s", 1, 9, SECOND)
        time.sleep(0.2)  # queued first: the oldest of the next call
        others = [pool.submit(client.check, "nc", f"w{i}", 1, 10, SECOND) for i in range(20)]
        time.sleep(0.5)
        servicer.gate.set()
        errors = [f.exception(10) for f in [short, *others]]
        first.join(5)
        assert client.check("nc", "after", 1, 10, SECOND).remaining == 9
    assert servicer.call_sizes[:2] == [1, 21] and servicer.keys[1][0] == "s"
    assert all(
        isinstance(e, ClientError)
        and e.code is grpc.StatusCode.INTERNAL
        and "20 responses for 21 requests" in e.details
        for e in errors
    ), errors


def test_a_timed_out_call_fails_its_checks_the_next_call_goes_on(
    gated: tuple[ServerThread, GatedServicer],
) -> None:
    """The lone first check is held by the server (its gate) until the test ends: it
    times out at the client's 0.5 s; the checks queued meanwhile go in the next call and
    are answered while the first is still held."""
    thread, servicer = gated
    with Client(thread.address, timeout=0.5) as client, ThreadPoolExecutor(11) as pool:
        slow = pool.submit(client.check, "slow", "s", 1, 9, SECOND)
        wait_for(lambda: len(servicer.keys) == 1, 5)
        others = [pool.submit(client.check, "nc", f"t{i}", 1, 10, SECOND) for i in range(10)]
        got = [f.result(30) for f in others]
        assert not servicer.gate.is_set()  # answered while the first call is held
        assert isinstance(slow.exception(30), ClientTimeout)
        servicer.gate.set()
    assert all(r.remaining == 9 for r in got)
    assert [len(keys) for keys in servicer.keys] == [1, 10]  # as they reached the server


def test_an_item_error_reaches_only_its_own_caller(
    gated: tuple[ServerThread, GatedServicer],
) -> None:
    thread, servicer = gated
    with Client(thread.address, timeout=5) as client:
        first = start_held(client, servicer)

        def worker(i: int) -> RateLimitResponse:  # every fourth has no key: an item error
            return client.check("nc", "" if i % 4 == 0 else f"i{i}", 1, 10, SECOND)

        pool = ThreadPoolExecutor(16)
        futures = [pool.submit(worker, i) for i in range(16)]
        time.sleep(0.5)
        servicer.gate.set()
        for i, future in enumerate(futures):
            if i % 4 == 0:
                assert isinstance(future.exception(10), ItemError)
            else:
                assert future.result(10).remaining == 9
        pool.shutdown()
        first.join(5)
    assert servicer.call_sizes == [1, 16]


def test_nobody_listening_every_check_unavailable() -> None:
    with Client(f"127.0.0.1:{free_ports(1)[0]}", timeout=1) as client:
        got = run_threads(16, lambda i: client.check("nc", f"u{i}", 1, 10, SECOND))
    assert all(isinstance(e, ClientUnavailable) for e in got), got


def test_closed_client_refuses_checks(gated: tuple[ServerThread, GatedServicer]) -> None:
    thread, servicer = gated
    servicer.gate.set()
    client = Client(thread.address)
    client.check("nc", "c", 1, 10, SECOND)
    client.close()
    with pytest.raises(ClientUnavailable, match="closed"):
        client.check("nc", "c", 1, 10, SECOND)


def test_which_coalescer(gated: tuple[ServerThread, GatedServicer]) -> None:
    """In the channel when every check goes there; in Python when lone checks take the
    HTTP gateway or grpcio; none with coalesce=False."""
    address = gated[0].address
    with Client(address) as native, Client(address, native=False) as grpcio:
        assert isinstance(native.coalescer, NativeCoalescer)
        assert isinstance(grpcio.coalescer, Coalescer)
    with Client(address, http_address="127.0.0.1:1") as http:
        assert isinstance(http.coalescer, Coalescer)
    with Client(address, http_address="127.0.0.1:1", transport="grpc") as grpc_only:
        assert isinstance(grpc_only.coalescer, NativeCoalescer)
    with Client(address, coalesce=False) as alone:
        assert alone.coalescer is None
