"""The Python client, sync and asyncio, against real grpc.aio servers on loopback.

``LimiterServicer`` hosts pb.gubernator.V1 backed by smockron.cluster.local.LocalLimiter
with a fixed clock, so every answer is exact. ``RawGubernator`` decodes and encodes the
protobuf bytes by hand from Gubernator's field numbers, without our generated modules:
it proves the client's wire is Gubernator's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
import pytest

from smockron.cluster.client import (
    SECOND,
    AsyncClient,
    Client,
    ClientError,
    ClientTimeout,
    ClientUnavailable,
    ItemError,
    grpc_target,
)
from smockron.cluster.convert import request_from_pb, response_to_pb
from smockron.cluster.local import LocalLimiter
from smockron.cluster.model import Algorithm, Behavior, RateLimitRequest, RateLimitResponse, Status
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc
from tests.support import free_ports

NOW = 1_700_000_000_000
pb_grpc: Any = gubernator_pb2_grpc  # generated without type hints


@dataclass
class LimiterServicer:
    """V1 over LocalLimiter; names starting ``slow``/``short`` misbehave on purpose."""

    limiter: LocalLimiter = field(default_factory=lambda: LocalLimiter(clock=lambda: NOW))
    call_sizes: list[int] = field(default_factory=list)

    async def GetRateLimits(self, request: Any, context: Any) -> pb.GetRateLimitsResp:
        self.call_sizes.append(len(request.requests))
        if any(msg.name.startswith("slow") for msg in request.requests):
            await asyncio.sleep(2)
        reqs = [request_from_pb(msg) for msg in request.requests]
        out = [response_to_pb(r) for r in await self.limiter.get_rate_limits(reqs)]
        if reqs and reqs[0].name.startswith("short"):
            out = out[:-1]
        return pb.GetRateLimitsResp(responses=out)

    async def HealthCheck(self, request: Any, context: Any) -> pb.HealthCheckResp:
        return pb.HealthCheckResp(status="healthy", peer_count=1, advertise_address="me:1051")

    async def LiveCheck(self, request: Any, context: Any) -> pb.LiveCheckResp:
        return pb.LiveCheckResp()


class ServerThread:
    """A grpc.aio server on its own loop in a thread, so sync clients can call it too."""

    def __init__(self, servicer: Any = None, handlers: Any = None) -> None:
        self.port = 0
        self.address = ""
        self._servicer = servicer
        self._handlers = handlers
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._serve(),))
        self._thread.start()
        assert self._ready.wait(10)

    async def _serve(self) -> None:
        server = grpc.aio.server()
        if self._servicer is not None:
            pb_grpc.add_V1Servicer_to_server(self._servicer, server)
        if self._handlers is not None:
            server.add_generic_rpc_handlers([self._handlers])
        # the port the server binds, not one picked free beforehand: another process of a
        # parallel run may take that one in between (grpc then serves nothing, silently)
        self.port = server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        await server.start()
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await server.stop(0)

    def close(self) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture
def server() -> Iterator[tuple[ServerThread, LimiterServicer]]:
    servicer = LimiterServicer()
    thread = ServerThread(servicer)
    yield thread, servicer
    thread.close()


@pytest.fixture
async def aclient(server: tuple[ServerThread, LimiterServicer]) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server[0].address, timeout=2) as client:
        yield client


def test_sync_check_counts_down_then_over_limit(server: tuple[ServerThread, Any]) -> None:
    with Client(server[0].address) as client:
        got = [client.check("rps", "acct:1", 1, 3, SECOND) for _ in range(4)]
    assert [(r.status, r.remaining) for r in got] == [
        (Status.UNDER_LIMIT, 2),
        (Status.UNDER_LIMIT, 1),
        (Status.UNDER_LIMIT, 0),
        (Status.OVER_LIMIT, 0),
    ]
    assert {r.reset_time for r in got} == {NOW + SECOND}
    assert got[0].limit == 3 and not got[0].error


async def test_async_check_and_timedelta_duration(aclient: AsyncClient) -> None:
    first = await aclient.check("rpm", "k", 5, 10, timedelta(minutes=1))
    query = await aclient.check("rpm", "k", 0, 10, timedelta(minutes=1))
    assert (first.remaining, query.remaining) == (5, 5)
    assert first.reset_time == NOW + 60_000


async def test_leaky_bucket_and_behavior_reach_the_server(aclient: AsyncClient) -> None:
    resp = await aclient.check(
        "lb",
        "k",
        4,
        10,
        SECOND,
        algorithm=Algorithm.LEAKY_BUCKET,
        burst=4,
        behavior=Behavior.NO_BATCHING | Behavior.DRAIN_OVER_LIMIT,
    )
    assert (resp.status, resp.remaining, resp.limit) == (Status.UNDER_LIMIT, 0, 10)


async def test_order_and_item_errors(aclient: AsyncClient) -> None:
    reqs = [
        RateLimitRequest("a", "1", hits=1, limit=5, duration=SECOND),
        RateLimitRequest("b", "1", hits=1, limit=-1, duration=SECOND),  # invalid
        RateLimitRequest("c", "1", hits=4, limit=5, duration=SECOND),
    ]
    got = await aclient.get_rate_limits(reqs)
    assert [r.remaining for r in got] == [4, 0, 1]
    assert got[1].error and not got[0].error and not got[2].error
    with pytest.raises(ItemError) as info:
        await aclient.check("b", "1", 1, -1, SECOND)
    assert info.value.response.error


async def test_more_than_1000_are_split_in_order(
    server: tuple[ServerThread, LimiterServicer], aclient: AsyncClient
) -> None:
    reqs = [
        RateLimitRequest("n", str(i), hits=i % 7, limit=10, duration=SECOND) for i in range(2500)
    ]
    got = await aclient.get_rate_limits(reqs)
    assert [r.remaining for r in got] == [10 - i % 7 for i in range(2500)]
    assert sorted(server[1].call_sizes) == [500, 1000, 1000]
    with Client(server[0].address) as client:
        assert len(client.get_rate_limits(reqs[:1001])) == 1001
        assert client.get_rate_limits([]) == []
    assert await aclient.get_rate_limits([]) == []


async def test_health_and_live_check(
    server: tuple[ServerThread, Any], aclient: AsyncClient
) -> None:
    health = await aclient.health_check()
    assert health.healthy and health.peer_count == 1 and health.advertise_address == "me:1051"
    await aclient.live_check()
    with Client(server[0].address) as client:
        assert client.health_check().status == "healthy"
        client.live_check()


async def test_timeout(server: tuple[ServerThread, Any], aclient: AsyncClient) -> None:
    with pytest.raises(ClientTimeout) as info:
        await aclient.check("slow", "k", 1, 1, SECOND, timeout=0.2)
    assert isinstance(info.value, TimeoutError)
    with Client(server[0].address, timeout=0.2) as client, pytest.raises(ClientTimeout):
        client.check("slow", "k", 1, 1, SECOND)


async def test_unavailable() -> None:
    address = f"127.0.0.1:{free_ports(1)[0]}"
    async with AsyncClient(address, timeout=1) as client:
        with pytest.raises(ClientUnavailable):
            await client.health_check()
    with Client(address, timeout=1) as sync, pytest.raises(ClientUnavailable):
        sync.check("a", "b", 1, 1, SECOND)


async def test_wrong_response_count_is_an_error(aclient: AsyncClient) -> None:
    with pytest.raises(ClientError, match="2 responses for 3 requests"):
        await aclient.get_rate_limits(
            [RateLimitRequest("short", str(i), hits=1, limit=1, duration=SECOND) for i in range(3)]
        )


def test_grpc_target() -> None:
    assert grpc_target("127.0.0.1:1051") == "127.0.0.1:1051"
    assert grpc_target("dns:///g.svc:1051") == "dns:///g.svc:1051"
    assert grpc_target(["10.0.0.1:1051", "10.0.0.2:1051"]) == "ipv4:10.0.0.1:1051,10.0.0.2:1051"
    assert grpc_target("[::1]:1051,[::2]:1051") == "ipv6:[::1]:1051,[::2]:1051"
    for bad in (["a:1", "b:1"], ["10.0.0.1:1", "[::1]:1"], ["10.0.0.1", "10.0.0.2"], []):
        with pytest.raises(ValueError):
            grpc_target(bad)


def test_bad_timeout_rejected() -> None:
    with pytest.raises(ValueError):
        Client("127.0.0.1:1", timeout=0)


# --- Gubernator's wire, by hand -------------------------------------------------------


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, i


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """Decode one message level: (field number, varint value or length-delimited bytes)."""
    out: list[tuple[int, int | bytes]] = []
    i = 0
    while i < len(data):
        tag, i = _read_varint(data, i)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, i = _read_varint(data, i)
            out.append((number, value))
        elif wire == 2:
            size, i = _read_varint(data, i)
            out.append((number, data[i : i + size]))
            i += size
        else:
            raise AssertionError(f"unexpected wire type {wire}")
    return out


def _ld(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _vi(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


if TYPE_CHECKING:
    _Handler = grpc.GenericRpcHandler[bytes, bytes]
else:  # not subscriptable at runtime
    _Handler = grpc.GenericRpcHandler


class RawGubernator(_Handler):
    """Answers /pb.gubernator.V1/* from raw bytes, as a Gubernator node would."""

    def __init__(self) -> None:
        self.seen: list[list[tuple[int, int | bytes]]] = []

    def service(self, details: Any) -> Any:
        if details.method == "/pb.gubernator.V1/GetRateLimits":
            return grpc.unary_unary_rpc_method_handler(self._get)
        if details.method == "/pb.gubernator.V1/HealthCheck":
            return grpc.unary_unary_rpc_method_handler(
                lambda req, ctx: _ld(1, b"healthy") + _vi(3, 3) + _ld(4, b"10.0.0.1:1051")
            )
        return None

    def _get(self, request: bytes, context: Any) -> bytes:
        out = b""
        for number, item in _fields(request):
            assert number == 1 and isinstance(item, bytes)  # GetRateLimitsReq.requests = 1
            fields = _fields(item)
            self.seen.append(fields)
            limit = next(v for n, v in fields if n == 4)
            assert isinstance(limit, int)
            resp = _vi(1, 1) + _vi(2, limit) + _vi(3, 0) + _vi(4, NOW) + _ld(5, b"")
            resp += _ld(6, _ld(1, b"owner") + _ld(2, b"10.0.0.1:1051"))  # map entry
            out += _ld(1, resp)  # GetRateLimitsResp.responses = 1
        return out


async def test_client_speaks_gubernators_wire() -> None:
    handler = RawGubernator()
    server = ServerThread(handlers=handler)
    try:
        async with AsyncClient(server.address) as client:
            resp = await client.check(
                "requests_per_sec",
                "account:42",
                2,
                100,
                SECOND,
                algorithm=Algorithm.LEAKY_BUCKET,
                behavior=Behavior.GLOBAL,
                burst=7,
                metadata={"region": "eu"},
            )
            health = await client.health_check()
    finally:
        server.close()
    fields = dict(handler.seen[0][:8])
    assert fields == {
        1: b"requests_per_sec",
        2: b"account:42",
        3: 2,
        4: 100,
        5: 1000,
        6: 1,
        7: 2,
        8: 7,
    }
    assert handler.seen[0][8] == (9, _ld(1, b"region") + _ld(2, b"eu"))
    assert resp == RateLimitResponse(
        status=Status.OVER_LIMIT,
        limit=100,
        remaining=0,
        reset_time=NOW,
        metadata={"owner": "10.0.0.1:1051"},
    )
    assert (health.status, health.peer_count, health.advertise_address) == (
        "healthy",
        3,
        "10.0.0.1:1051",
    )


def test_exported_names_exist() -> None:
    import smockron.cluster.client as module

    for name in module.__all__:
        assert hasattr(module, name), name
