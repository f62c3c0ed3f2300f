"""Both client transports, the native libgrpc++ channel and grpcio, give the same answers
and raise the same errors: against real grpc.aio servers on loopback (``ServerThread``
from test_client.py, plus a servicer failing on purpose) and a real ``smockron cluster``
node process. The native cases are skipped where the extension is not built."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from smockron.cluster.client import (
    MINUTE,
    NATIVE_AVAILABLE,
    SECOND,
    AsyncClient,
    Client,
    ClientError,
    ClientTimeout,
    ClientUnavailable,
    ItemError,
)
from smockron.cluster.model import RateLimitRequest, Status
from tests.cluster.test_client import NOW, LimiterServicer, ServerThread
from tests.support import free_ports, run_smockron, wait_port

needs_native = pytest.mark.skipif(not NATIVE_AVAILABLE, reason="_nativeclient not built")
TRANSPORTS = [pytest.param(True, id="native", marks=needs_native), pytest.param(False, id="grpcio")]


class FailingServicer(LimiterServicer):
    """Names starting ``fail`` abort the call with RESOURCE_EXHAUSTED."""

    async def GetRateLimits(self, request: Any, context: Any) -> Any:
        if any(msg.name.startswith("fail") for msg in request.requests):
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too much, stop")
        return await super().GetRateLimits(request, context)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[ServerThread, FailingServicer]]:
    servicer = FailingServicer()
    thread = ServerThread(servicer)
    yield thread, servicer
    thread.close()


@pytest.mark.parametrize("native", TRANSPORTS)
def test_sync_answers_and_errors(server: tuple[ServerThread, Any], native: bool) -> None:
    address = server[0].address
    with Client(address, timeout=1, native=native) as client:
        assert client.native is native
        got = [client.check("nat_rps", f"s{native}", 1, 2, SECOND) for _ in range(3)]
        assert [(r.status, r.remaining) for r in got] == [
            (Status.UNDER_LIMIT, 1),
            (Status.UNDER_LIMIT, 0),
            (Status.OVER_LIMIT, 0),
        ]
        assert got[0].reset_time == NOW + SECOND
        # plain ints, as callers without the enums pass them (the signature says the enums)
        plain_ints = client.check(
            "nat_lb",
            f"i{native}",
            1,
            5,
            SECOND,
            algorithm=1,  # type: ignore[arg-type]
            behavior=0,  # type: ignore[arg-type]
        )
        assert (plain_ints.status, plain_ints.remaining) == (Status.UNDER_LIMIT, 4)
        with pytest.raises(ValueError):
            client.check("nat_lb", "k", 1, 5, SECOND, algorithm=7)  # type: ignore[arg-type]
        many = [RateLimitRequest("nat_n", f"{native}{i}", 1, 5, SECOND) for i in range(1001)]
        assert [r.remaining for r in client.get_rate_limits(many)] == [4] * 1001
        assert client.health_check().advertise_address == "me:1051"
        client.live_check()
        with pytest.raises(ItemError):
            client.check("nat_bad", "k", 1, -1, SECOND)
        with pytest.raises(ClientTimeout) as timeout:
            client.check("slow", "k", 1, 1, SECOND, timeout=0.2)
        assert timeout.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
        with pytest.raises(ClientError) as failed:
            client.check("fail", "k", 1, 1, SECOND)
        assert not isinstance(failed.value, (ClientTimeout, ClientUnavailable))
        assert failed.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert failed.value.details == "too much, stop"
        assert "GetRateLimits on" in str(failed.value)
        with pytest.raises(ClientError, match="2 responses for 3 requests"):
            client.get_rate_limits(
                [RateLimitRequest("short", str(i), 1, 1, SECOND) for i in range(3)]
            )
        # the client goes on after every error
        assert client.check("nat_rps", f"after{native}", 1, 2, SECOND).remaining == 1


@pytest.mark.parametrize("native", TRANSPORTS)
async def test_async_answers_and_errors(server: tuple[ServerThread, Any], native: bool) -> None:
    async with AsyncClient(server[0].address, timeout=1, native=native) as client:
        assert client.native is native
        got = await asyncio.gather(
            *(client.check("nat_arps", f"a{native}", 1, 50, SECOND) for _ in range(20))
        )
        assert sorted(r.remaining for r in got) == list(range(30, 50))
        assert (await client.health_check()).healthy
        await client.live_check()
        with pytest.raises(ClientTimeout):
            await client.check("slow", "k", 1, 1, SECOND, timeout=0.2)
        with pytest.raises(ClientError) as failed:
            await client.check("fail", "k", 1, 1, SECOND)
        assert failed.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        many = [RateLimitRequest("nat_an", f"{native}{i}", 1, 5, SECOND) for i in range(2001)]
        assert [r.remaining for r in await client.get_rate_limits(many)] == [4] * 2001


@pytest.mark.parametrize("native", TRANSPORTS)
async def test_unreachable_is_unavailable(native: bool) -> None:
    address = f"127.0.0.1:{free_ports(1)[0]}"
    with Client(address, timeout=2, native=native) as client:
        with pytest.raises(ClientUnavailable) as info:
            client.check("a", "b", 1, 1, SECOND)
        assert info.value.code is grpc.StatusCode.UNAVAILABLE
        with pytest.raises(ClientUnavailable):
            client.live_check()
    async with AsyncClient(address, timeout=2, native=native) as aclient:
        with pytest.raises(ClientUnavailable):
            await aclient.health_check()  # failed fast: at the deadline, ClientTimeout


@needs_native
async def test_async_close_cancels_calls_in_flight(server: tuple[ServerThread, Any]) -> None:
    client = AsyncClient(server[0].address, timeout=5, native=True)
    call = asyncio.ensure_future(client.check("slow", "k", 1, 1, SECOND))
    await asyncio.sleep(0.1)
    await client.close()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(call, 2)
    with pytest.raises(ClientUnavailable, match="closed"):
        await client.live_check()


@needs_native
def test_threads_share_native_calls(server: tuple[ServerThread, FailingServicer]) -> None:
    """Many threads on one native Client: fewer calls than checks, each answered check
    counted exactly once, and a failing call's error reaches each check it carried."""
    with Client(server[0].address, timeout=5) as client, ThreadPoolExecutor(16) as pool:

        def one(i: int) -> object:
            name = "fail" if i % 40 == 0 else "nat_t"
            try:
                return client.check(name, f"k{i % 4}", 1, 1000, SECOND).remaining
            except ClientError as exc:
                return exc

        got = list(pool.map(one, range(400)))
        assert client.coalescer is not None and client.coalescer.calls < 400
    ok = [r for r in got if isinstance(r, int)]
    # a failing check fails its whole coalesced call: only checks in calls with no
    # ``fail`` item were counted, each exactly once
    for k in range(4):
        mine = sorted(
            (r for i, r in enumerate(got) if i % 4 == k and isinstance(r, int)), reverse=True
        )
        assert mine == list(range(999, 999 - len(mine), -1))
    failed = [r for r in got if not isinstance(r, int)]
    assert ok and len(ok) + len(failed) == 400
    assert all(isinstance(got[i], ClientError) for i in range(0, 400, 40))
    assert all(
        isinstance(r, ClientError) and r.code is grpc.StatusCode.RESOURCE_EXHAUSTED for r in failed
    )


def test_transport_choice() -> None:
    creds = grpc.ssl_channel_credentials()
    with Client("127.0.0.1:1", credentials=creds) as tls:
        assert tls.native is False  # TLS always goes through grpcio
    with Client("127.0.0.1:1", native=False) as plain:
        assert plain.native is False
    with Client("127.0.0.1:1", options=[("grpc.keepalive_time_ms", 1.5)]) as odd:
        assert odd.native is False  # a value libgrpc++ cannot take: grpcio
    if NATIVE_AVAILABLE:
        with Client("127.0.0.1:1") as default:
            assert default.native is True
        with pytest.raises(ValueError, match="TLS"):
            Client("127.0.0.1:1", credentials=creds, native=True)
    else:
        with pytest.raises(ValueError, match="not built"):
            Client("127.0.0.1:1", native=True)


@pytest.mark.parametrize("native", TRANSPORTS)
def test_real_node_process(tmp_path: Path, native: bool) -> None:
    """A real ``smockron cluster`` node (its default gRPC server), one sync client from
    several threads and one asyncio client."""
    grpc_port, http_port = free_ports(2)
    address = f"127.0.0.1:{grpc_port}"
    proc = run_smockron(
        ["cluster", "--grpc-address", address, "--http-address", f"127.0.0.1:{http_port}"],
        tmp_path / "node.log",
    )
    try:
        wait_port(grpc_port, timeout=20)
        with Client(address, timeout=5, native=native) as client:
            barrier = threading.Barrier(8)

            def worker(i: int) -> list[int]:
                barrier.wait(5)
                return [
                    client.check("nat_real", "acct", 1, 100, MINUTE).remaining for _ in range(5)
                ]

            with ThreadPoolExecutor(8) as pool:
                got = [r for rs in pool.map(worker, range(8)) for r in rs]
            assert sorted(got) == list(range(60, 100))
            assert client.health_check().healthy

        async def use_async() -> list[int]:
            async with AsyncClient(address, timeout=5, native=native) as aclient:
                resps = await asyncio.gather(
                    *(aclient.check("nat_real", "acct", 1, 100, MINUTE) for _ in range(10))
                )
                return sorted(r.remaining for r in resps)

        assert asyncio.run(use_async()) == list(range(50, 60))
    finally:
        proc.stop()
