"""A lone check for another node, through the native gRPC server, is forwarded from the
gRPC thread as it came (api.forward_now) rather than through the event loop's batcher;
if that call fails the batched path decides it. Two real nodes in this process, real
gRPC between them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc
import pytest

from smockron.cluster import peers
from smockron.cluster.config import ClusterConfig
from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc
from smockron.cluster.server import ClusterServer
from smockron.cluster.transports import native
from tests.support import free_ports

pytestmark = pytest.mark.skipif(
    not native.AVAILABLE or peers._nativeclient is None,
    reason="the native server and client channel are not built",
)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[ClusterServer, ClusterServer]]:
    g1, g2 = free_ports(2)
    base = ClusterConfig(http_address="", grpc_server="native", batch_timeout_ms=5000,
                         peer_down_after=1000)  # fmt: skip
    ca = replace(base, grpc_address=f"127.0.0.1:{g1}")
    cb = replace(base, grpc_address=f"127.0.0.1:{g2}")
    a, b = ClusterServer(ca), ClusterServer(cb)
    infos = [PeerInfo(ca.grpc_address), PeerInfo(cb.grpc_address)]
    for server in (a, b):
        await server.start()
        server.node.set_peers(infos)
    try:
        yield a, b
    finally:
        await a.stop()
        await b.stop()


def _count(server: ClusterServer, route: str) -> float:
    return float(server.node.metrics.checks.labels(route)._value.get())


async def _checks(address: str, keys: list[str]) -> list[Any]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub: Any = gubernator_pb2_grpc.V1Stub(channel)  # type: ignore[no-untyped-call]
        out = []
        for key in keys:  # one at a time: the lone forward's case
            req = pb.RateLimitReq(name="fn", unique_key=key, hits=1, limit=5, duration=60_000)
            resp = await stub.GetRateLimits(pb.GetRateLimitsReq(requests=[req]), timeout=10)
            out.append(resp.responses[0])
        return out


async def test_lone_forwards_skip_the_batcher_and_count_exactly(
    pair: tuple[ClusterServer, ClusterServer],
) -> None:
    a, b = pair
    key = next(f"k{i}" for i in range(1000) if a.node.ring.owner(f"fn_k{i}") == b.node.address)
    answers = await _checks(a.node.address, [key] * 8)
    assert [r.remaining for r in answers] == [4, 3, 2, 1, 0, 0, 0, 0]
    assert [r.status for r in answers] == [pb.UNDER_LIMIT] * 5 + [pb.OVER_LIMIT] * 3
    assert {r.metadata["owner"] for r in answers} == {b.node.address}
    assert (_count(a, "forwarded"), _count(b, "peer"), _count(a, "local")) == (8, 8, 0)
    client = a.node.clients[b.node.address]
    # the first forward went batched (it starts the loop watching the channel); the rest
    # went from the gRPC thread
    assert client._batcher.batches_sent == 1


async def test_a_failed_forward_is_decided_by_the_batched_path(
    pair: tuple[ClusterServer, ClusterServer],
) -> None:
    a, b = pair
    theirs = [f"k{i}" for i in range(1000) if a.node.ring.owner(f"fn_k{i}") == b.node.address]
    await _checks(a.node.address, theirs[:2])  # the channel is watched: fast path on
    await b.stop()
    answers = await _checks(a.node.address, theirs[2:5])
    assert [(r.error, r.remaining) for r in answers] == [("", 4)] * 3
    assert {r.metadata["owner"] for r in answers} == {a.node.address}  # answered here
    assert _count(a, "owner_failed") == 3
    assert a.node.clients[b.node.address].consecutive_failures >= 3
