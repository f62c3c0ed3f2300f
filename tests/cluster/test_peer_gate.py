"""The peer listener serves PeersV1 to the cluster's members only: by address (the peer
list discovery gives), and with TLS by the names of ``peer_tls_names``. Real nodes,
real gRPC clients on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from smockron.cluster import tlsgen
from smockron.cluster.config import ClusterConfig
from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.discovery.static import StaticDiscovery
from smockron.cluster.model import RateLimitRequest
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc, peers_pb2, peers_pb2_grpc
from smockron.cluster.peergate import peer_ip
from smockron.cluster.server import ClusterServer
from smockron.cluster.transports import native
from smockron.errors import ConfigError
from tests.cluster.servers import serving
from tests.support import free_ports

SERVERS = ["threads", "asyncio", *(["native"] if native.AVAILABLE else [])]
CHECK = pb.RateLimitReq(name="api", unique_key="victim", hits=1, limit=100, duration=60_000)
FORGED = peers_pb2.UpdatePeerGlobal(
    key="api_victim",
    status=pb.RateLimitResp(limit=100, remaining=0, reset_time=2**41),
    algorithm=0,  # type: ignore[arg-type]
    duration=60_000,
)
NOT_MEMBER = "smockron_cluster_peer_calls_not_member_total"


async def forge(target: str, credentials: grpc.ChannelCredentials | None = None) -> grpc.StatusCode:
    """A GetPeerRateLimits then an UpdatePeerGlobals to ``target``: the first failing
    call's code, or OK."""
    channel = (
        grpc.aio.secure_channel(target, credentials)
        if credentials is not None
        else grpc.aio.insecure_channel(target)
    )
    async with channel:
        peers: Any = peers_pb2_grpc.PeersV1Stub(channel)  # type: ignore[no-untyped-call]
        try:
            await peers.GetPeerRateLimits(
                peers_pb2.GetPeerRateLimitsReq(requests=[CHECK]), timeout=5
            )
            await peers.UpdatePeerGlobals(
                peers_pb2.UpdatePeerGlobalsReq(globals=[FORGED]), timeout=5
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("kind", SERVERS)
async def test_a_process_that_is_no_member_is_refused(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    me, other = free_ports(2)
    config = ClusterConfig(grpc_address=f"127.0.0.1:{me}", http_address="", grpc_server=kind)
    # the one other member is on another host: this host's processes are not members
    discovery = StaticDiscovery([config.grpc_address, f"192.0.2.7:{other}"])
    server = ClusterServer(config, discovery)
    await server.start()
    registry = server.node.metrics.registry
    try:
        with caplog.at_level(logging.WARNING, "smockron.cluster"):
            for _ in range(5):
                assert await forge(config.peer_listen_address) == grpc.StatusCode.PERMISSION_DENIED
        assert "api_victim" not in server.node.replicas  # nothing forged
        assert registry.get_sample_value(NOT_MEMBER, {"method": "GetPeerRateLimits"}) == 5
        lines = [r.getMessage() for r in caplog.records if "not a member" in r.getMessage()]
        assert 1 <= len(lines) <= 2 and "127.0.0.1" in lines[0]  # rate-limited
        async with grpc.aio.insecure_channel(config.peer_listen_address) as channel:
            v1: Any = gubernator_pb2_grpc.V1Stub(channel)  # type: ignore[no-untyped-call]
            await v1.LiveCheck(pb.LiveCheckReq(), timeout=5)  # probes stay open
        # a member on this host, named as discovery may name it: its calls are taken
        server.node.set_peers([PeerInfo(config.grpc_address), PeerInfo(f"localhost:{other}")])
        assert await forge(config.peer_listen_address) == grpc.StatusCode.OK
        assert "api_victim" in server.node.replicas
    finally:
        await server.stop()


async def test_members_call_each_other() -> None:
    """Two nodes on one host: each is in the other's list, forwarding works."""
    g1, g2 = free_ports(2)
    base = ClusterConfig(http_address="", peer_probe_interval_ms=50)
    configs = [replace(base, grpc_address=f"127.0.0.1:{g}") for g in (g1, g2)]
    peers = [PeerInfo(c.grpc_address) for c in configs]
    a, b = (ClusterServer(c) for c in configs)
    for server in (a, b):
        await server.start()
        server.node.set_peers(peers)
    try:
        key = next(
            k
            for k in (f"k{i}" for i in range(1000))
            if b.node.ring.owner(f"n_{k}") == b.node.address
        )
        resp = await a.node.get_rate_limits([RateLimitRequest("n", key, 1, 10, 60_000)])
        assert (resp[0].error, resp[0].metadata["owner"]) == ("", b.node.address)
        assert b.node.metrics.registry.get_sample_value(
            NOT_MEMBER, {"method": "GetPeerRateLimits"}
        ) in (None, 0.0)
    finally:
        await a.stop()
        await b.stop()


async def test_peers_on_the_grpc_port_are_gated_too() -> None:
    me, other = free_ports(2)
    config = ClusterConfig(
        grpc_address=f"127.0.0.1:{me}",
        http_address="",
        grpc_server="threads",
        peers_on_grpc_port=True,
    )
    server = ClusterServer(config, StaticDiscovery([config.grpc_address, f"192.0.2.7:{other}"]))
    await server.start()
    try:
        assert await forge(config.grpc_address) == grpc.StatusCode.PERMISSION_DENIED
        async with grpc.aio.insecure_channel(config.grpc_address) as channel:
            v1: Any = gubernator_pb2_grpc.V1Stub(channel)  # type: ignore[no-untyped-call]
            answer = await v1.GetRateLimits(pb.GetRateLimitsReq(requests=[CHECK]), timeout=5)
        assert answer.responses[0].error == ""  # clients keep the client API
    finally:
        await server.stop()


# -- TLS: a certificate of the cluster's CA is not enough ----------------------------------


def write_pki(folder: Path) -> dict[str, Path]:
    """One CA; a node certificate (127.0.0.1, node.cluster); a client's (client.example)."""
    ca, ca_key = tlsgen.make_ca()
    made = {"ca.pem": ca}
    for name, sans in (("node", ["127.0.0.1", "node.cluster"]), ("client", ["client.example"])):
        made[f"{name}.pem"], made[f"{name}.key"] = tlsgen.make_cert(ca, ca_key, sans)
    paths = {}
    for name, data in made.items():
        (folder / name).write_bytes(data)
        paths[name] = folder / name
    return paths


def credentials(pki: dict[str, Path], who: str) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=pki["ca.pem"].read_bytes(),
        private_key=pki[f"{who}.key"].read_bytes(),
        certificate_chain=pki[f"{who}.pem"].read_bytes(),
    )


@pytest.mark.parametrize("kind", SERVERS)
async def test_peer_tls_names_keep_other_certificates_of_the_ca_out(
    kind: str, tmp_path: Path
) -> None:
    pki = write_pki(tmp_path)
    (me,) = free_ports(1)
    config = ClusterConfig(
        grpc_address=f"127.0.0.1:{me}",
        http_address="",
        grpc_server=kind,
        tls_cert=str(pki["node.pem"]),
        tls_key=str(pki["node.key"]),
        tls_ca=str(pki["ca.pem"]),
        tls_client_auth="require-and-verify",
        peer_tls_names="node.cluster,other.cluster",
        peer_check_address=False,  # the certificate alone decides here
    )
    async with serving(config) as server:
        registry = server.node.metrics.registry
        refused = await forge(config.peer_listen_address, credentials(pki, "client"))
        assert refused == grpc.StatusCode.UNAVAILABLE  # as a refused handshake
        assert "api_victim" not in server.node.replicas
        assert (
            registry.get_sample_value("smockron_cluster_peer_tls_names_refused_total") or 0
        ) >= 1
        # the same client certificate still calls the client API
        client = grpc.aio.secure_channel(config.grpc_address, credentials(pki, "client"))
        async with client:
            v1: Any = gubernator_pb2_grpc.V1Stub(client)  # type: ignore[no-untyped-call]
            answer = await v1.GetRateLimits(pb.GetRateLimitsReq(requests=[CHECK]), timeout=5)
        assert answer.responses[0].error == ""
        # a certificate with one of the names: a peer
        assert (
            await forge(config.peer_listen_address, credentials(pki, "node")) == grpc.StatusCode.OK
        )
        assert "api_victim" in server.node.replicas
    await asyncio.sleep(0)


def test_peer_tls_names_need_verified_client_certificates(tmp_path: Path) -> None:
    pki = write_pki(tmp_path)
    config = ClusterConfig(
        grpc_address="127.0.0.1:1",
        http_address="",
        tls_cert=str(pki["node.pem"]),
        tls_key=str(pki["node.key"]),
        tls_ca=str(pki["ca.pem"]),
        tls_client_auth="verify-cert",
        peer_tls_names="node.cluster",
    )
    with pytest.raises(ConfigError, match="require-and-verify"):
        ClusterServer(config)
    with pytest.raises(ConfigError, match="require-and-verify"):
        ClusterServer(ClusterConfig(grpc_address="127.0.0.1:1", peer_tls_names="node.cluster"))


@pytest.mark.parametrize(
    ("peer", "ip"),
    [
        ("ipv4:10.0.0.5:4242", "10.0.0.5"),
        ("ipv6:[::1]:4242", "::1"),
        ("ipv6:%5B::1%5D:4242", "::1"),
        ("ipv6:[::ffff:127.0.0.1]:4242", "127.0.0.1"),
        ("unix:/tmp/sock", None),
        ("ipv4:not-an-ip:1", None),
        ("", None),
    ],
)
def test_peer_addresses_as_grpc_writes_them(peer: str, ip: str | None) -> None:
    found = peer_ip(peer)
    assert (str(found) if found is not None else None) == ip


async def test_a_member_removed_is_refused_on_its_open_connection() -> None:
    me, other = free_ports(2)
    config = ClusterConfig(grpc_address=f"127.0.0.1:{me}", http_address="", grpc_server="threads")
    server = ClusterServer(config, StaticDiscovery([config.grpc_address, f"127.0.0.1:{other}"]))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(config.peer_listen_address) as channel:
            peers: Any = peers_pb2_grpc.PeersV1Stub(channel)  # type: ignore[no-untyped-call]
            request = peers_pb2.GetPeerRateLimitsReq(requests=[CHECK])
            for _ in range(3):  # a member: served (and remembered for this connection)
                await peers.GetPeerRateLimits(request, timeout=5)
            server.node.set_peers([PeerInfo(config.grpc_address), PeerInfo(f"192.0.2.7:{other}")])
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await peers.GetPeerRateLimits(request, timeout=5)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await server.stop()
