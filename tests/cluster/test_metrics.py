"""The cluster's counters belong to a node: two nodes in one process count apart, and a
registry passed in is the one counted on."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import grpc
from prometheus_client import REGISTRY, CollectorRegistry

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
        config = ClusterConfig(
            grpc_address=f"127.0.0.1:{port}", http_address="", grpc_server="asyncio"
        )
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


MALFORMED = "smockron_cluster_http_malformed_total"


async def test_two_nodes_count_malformed_http_apart() -> None:
    """Bad JSON and bytes that are not HTTP are counted by the node whose gateway got
    them, and nothing lands on the process's default registry."""
    ports = free_ports(4)
    servers = []
    for g, h in ((ports[0], ports[1]), (ports[2], ports[3])):
        config = ClusterConfig(
            grpc_address=f"127.0.0.1:{g}", http_address=f"127.0.0.1:{h}", grpc_server="asyncio"
        )
        servers.append(ClusterServer(config, StaticDiscovery([config.grpc_address])))
    for server in servers:
        await server.start()
    try:
        first, second = (s.config.http_address for s in servers)
        async with aiohttp.ClientSession() as session:
            for body in ("{not json", "[1]", '{"requests": 5}'):
                async with session.post(f"http://{first}/v1/GetRateLimits", data=body) as r:
                    assert r.status == 400
        for address, times in ((first, 1), (second, 2)):
            host, port = address.split(":")
            for _ in range(times):
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(b"NOT HTTP AT ALL\r\n\r\n")
                assert b" 400 " in await asyncio.wait_for(reader.readline(), 5)
                writer.close()
                await writer.wait_closed()
    finally:
        for server in servers:
            await server.stop()
    counts = [
        {
            reason: s.node.metrics.registry.get_sample_value(MALFORMED, {"reason": reason})
            for reason in ("bad_json", "bad_fields", "bad_http")
        }
        for s in servers
    ]
    assert counts == [
        {"bad_json": 2, "bad_fields": 1, "bad_http": 1},
        {"bad_json": None, "bad_fields": None, "bad_http": 2},
    ]
    assert REGISTRY.get_sample_value(MALFORMED, {"reason": "bad_http"}) is None
