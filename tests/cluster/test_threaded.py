"""The threaded gRPC server: which calls are answered on the gRPC thread, and the bridge
that runs the other (asyncio) handlers on the node's event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from smockron.cluster.config import ClusterConfig
from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.model import Behavior, RateLimitRequest
from smockron.cluster.node import Node
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc
from smockron.cluster.transports.threaded import ThreadedServer
from tests.support import free_ports


def req(key: str, behavior: Behavior = Behavior.BATCHING) -> RateLimitRequest:
    return RateLimitRequest("n", key, hits=1, limit=10, duration=60_000, behavior=behavior)


async def test_answer_here_only_for_what_this_node_decides_alone() -> None:
    me, other = free_ports(2)
    node = Node(ClusterConfig(grpc_address=f"127.0.0.1:{me}"))
    try:
        node.set_peers([PeerInfo(f"127.0.0.1:{me}"), PeerInfo(f"127.0.0.1:{other}")])
        keys = [f"k{i}" for i in range(200)]
        mine = [k for k in keys if node.ring.owner(f"n_{k}") == node.address]
        theirs = [k for k in keys if k not in mine]
        assert mine and theirs
        answered = node.answer_here([req(k) for k in mine[:5]])
        assert answered is not None
        assert [r.remaining for r in answered] == [9] * 5
        assert all(r.metadata["owner"] == node.address for r in answered)
        # one item owned elsewhere, or one GLOBAL item, sends the whole call to the loop
        assert node.answer_here([req(mine[0]), req(theirs[0])]) is None
        assert node.answer_here([req(mine[0], Behavior.GLOBAL)]) is None
        # and nothing was counted for the refused calls
        assert node.answer_here([req(mine[0])])[0].remaining == 8  # type: ignore[index]
        # a peer's call is decided here whoever the ring says owns it, except GLOBAL
        assert node.answer_here([req(theirs[0])], peer=True) is not None
        assert node.answer_here([req(theirs[0], Behavior.GLOBAL)], peer=True) is None
    finally:
        await node.close()


class Probe:
    """An asyncio servicer that records the thread it ran on."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    async def LiveCheck(self, request: Any, context: Any) -> pb.LiveCheckResp:
        self.threads.append(threading.current_thread().name)
        await asyncio.sleep(0)
        if request is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "undecodable")
        return pb.LiveCheckResp()


@pytest.fixture
async def bridged() -> AsyncIterator[tuple[Probe, str]]:
    (port,) = free_ports(1)
    server = ThreadedServer(asyncio.get_running_loop())
    probe = Probe()

    def parse(data: bytes) -> Any:
        return None if data.startswith(b"\xff") else pb.LiveCheckReq.FromString(data)

    handler = grpc.unary_unary_rpc_method_handler(
        probe.LiveCheck,
        request_deserializer=parse,
        response_serializer=pb.LiveCheckResp.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("pb.gubernator.V1", {"LiveCheck": handler}),)
    )
    assert server.add_insecure_port(f"127.0.0.1:{port}") == port
    await server.start()
    try:
        yield probe, f"127.0.0.1:{port}"
    finally:
        await server.stop(1.0)


async def test_asyncio_handlers_run_on_the_event_loop(bridged: tuple[Probe, str]) -> None:
    probe, address = bridged
    async with grpc.aio.insecure_channel(address) as channel:
        stub: Any = gubernator_pb2_grpc.V1Stub(channel)  # type: ignore[no-untyped-call]
        answers = await asyncio.gather(*(stub.LiveCheck(pb.LiveCheckReq()) for _ in range(20)))
    assert answers == [pb.LiveCheckResp()] * 20
    assert set(probe.threads) == {threading.current_thread().name}


async def test_bridged_abort_and_undecodable_request(bridged: tuple[Probe, str]) -> None:
    """grpc.server would fail a request that deserializes to None with INTERNAL; bridged
    handlers get None as under grpc.aio, and their ``await context.abort`` sets the code."""
    _, address = bridged
    async with grpc.aio.insecure_channel(address) as channel:
        raw = channel.unary_unary("/pb.gubernator.V1/LiveCheck", None, None)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await raw(b"\xff\xff", timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "undecodable"
