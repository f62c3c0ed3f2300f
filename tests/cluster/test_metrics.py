"""The cluster's counters belong to a node: two nodes in one process count apart, and a
registry passed in is the one counted on."""

from __future__ import annotations

from typing import Any

import grpc
from prometheus_client import CollectorRegistry

from smockron.cluster.config import ClusterConfig
from smockron.cluster.discovery.static import StaticDiscovery
from smockron.cluster.metrics import ClusterMetrics
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc
from smockron.cluster.server import ClusterServer
from tests.support import free_ports

CHECKS = "smockron_cluster_checks_total"


async def test_two_nodes_count_apart_on_their_own_registries() -> None:
    registry = CollectorRegistry()
    servers = []
    for port, metrics in zip(free_ports(2), (ClusterMetrics(registry), None), strict=True):
        config = ClusterConfig(grpc_address=f"127.0.0.1:{port}", http_address="",
                               grpc_server="asyncio")  # fmt: skip
        servers.append(ClusterServer(config, StaticDiscovery([config.grpc_address]), (), metrics))
    for server in servers:
        await server.start()
    try:
        req = pb.RateLimitReq(name="m", unique_key="k", hits=1, limit=5, duration=60_000)
        for server, calls in zip(servers, (3, 1), strict=True):
            async with grpc.aio.insecure_channel(server.config.grpc_address) as channel:
                stub: Any = gubernator_pb2_grpc.V1Stub(channel)  # type: ignore[no-untyped-call]
                for _ in range(calls):
                    await stub.GetRateLimits(pb.GetRateLimitsReq(requests=[req]), timeout=5)
    finally:
        for server in servers:
            await server.stop()
    assert servers[0].node.metrics.registry is registry
    assert registry.get_sample_value(CHECKS, {"route": "local"}) == 3
    other = servers[1].node.metrics.registry
    assert other is not registry
    assert other.get_sample_value(CHECKS, {"route": "local"}) == 1
