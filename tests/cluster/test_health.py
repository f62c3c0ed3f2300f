"""HealthCheck's peer lists and Gubernator's wording, on a Node in-process (no network:
the peers are never called)."""

from __future__ import annotations

from smockron.cluster.api import health_pb
from smockron.cluster.config import ClusterConfig
from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.node import Node
from smockron.cluster.pb import gubernator_pb2 as pb


async def test_local_and_region_peers_split_by_data_center() -> None:
    """As Gubernator's TestHealthCheck: local_peers are the nodes of this node's data
    center (itself included), region_peers the others; peer_count counts both."""
    node = Node(ClusterConfig(grpc_address="127.0.0.1:9990", data_center="one"))
    try:
        node.set_peers(
            [
                PeerInfo("127.0.0.1:9990", data_center="one"),
                PeerInfo("127.0.0.1:9991", data_center="one"),
                PeerInfo("127.0.0.1:9890", data_center=""),
                PeerInfo("127.0.0.1:9891", data_center="two"),
            ]
        )
        health = health_pb(node)
    finally:
        await node.close()
    assert (health.status, health.peer_count, health.advertise_address) == (
        "healthy",
        4,
        "127.0.0.1:9990",
    )
    assert [(p.grpc_address, p.data_center) for p in health.local_peers] == [
        ("127.0.0.1:9990", "one"),
        ("127.0.0.1:9991", "one"),
    ]
    assert [(p.grpc_address, p.data_center) for p in health.region_peers] == [
        ("127.0.0.1:9890", ""),
        ("127.0.0.1:9891", "two"),
    ]


async def test_missing_from_the_peer_list_uses_gubernators_words() -> None:
    node = Node(ClusterConfig(grpc_address="127.0.0.1:9990"))
    try:
        node.set_peers([PeerInfo("127.0.0.1:9991")])
        health = health_pb(node)
    finally:
        await node.close()
    assert health.status == "unhealthy" and health.advertise_address == ""
    assert health.message == "this instance is not found in the peer list"
    # the node still lists itself: it is in its own ring
    assert [p.grpc_address for p in health.local_peers] == ["127.0.0.1:9990", "127.0.0.1:9991"]
    assert list(health.region_peers) == []
    assert isinstance(health, pb.HealthCheckResp)
