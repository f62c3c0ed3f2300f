"""etcd discovery against a real etcd started by the ``etcd_server`` fixture."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import aetcd
import pytest
from prometheus_client import CollectorRegistry

from smockron.cluster.client import MINUTE, AsyncClient
from smockron.cluster.config import ClusterConfig
from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.discovery.etcd import EtcdDiscovery, decode_peer, encode_peer
from smockron.cluster.metrics import ClusterMetrics
from smockron.cluster.server import ClusterServer
from tests.cluster.test_discovery_support import (
    Recorder,
    assert_each_forwards_to_the_other,
    peer_count_becomes,
    scraped,
    until,
)
from tests.support import EtcdServer, Proc, free_ports, run_smockron, stopping, wait_port

PREFIX = "/gubernator-peers"


def node(etcd: EtcdServer, n: int, start_timeout: float = 10.0) -> EtcdDiscovery:
    """Node n at 127.0.0.n, with short lease and backoff so failures show quickly."""
    me = PeerInfo(f"127.0.0.{n}:1051", f"127.0.0.{n}:1050")
    return EtcdDiscovery(
        me, etcd.endpoint, lease_ttl=2, backoff=0.2, timeout=2.0, start_timeout=start_timeout
    )


@pytest.fixture
async def raw(etcd_server: EtcdServer) -> AsyncIterator[aetcd.Client]:
    client = aetcd.Client(port=etcd_server.client_port, host="127.0.0.1", timeout=10)
    await client.connect()
    yield client
    await client.close()


def test_value_is_gubernator_peer_json() -> None:
    peer = PeerInfo("10.0.0.1:1051", "10.0.0.1:1050", "dc1")
    assert json.loads(encode_peer(peer)) == {
        "data-center": "dc1",
        "http-address": "10.0.0.1:1050",
        "grpc-address": "10.0.0.1:1051",
    }
    assert decode_peer(encode_peer(peer)) == peer
    # Gubernator adds is-owner; it is ignored
    assert decode_peer(b'{"grpc-address": "a:1", "is-owner": true}') == PeerInfo("a:1")
    assert decode_peer(b"10.0.0.9:1051") == PeerInfo("10.0.0.9:1051")


def test_value_carries_the_peer_address_where_gubernator_ignores_it() -> None:
    peer = PeerInfo("10.0.0.1:1051", "10.0.0.1:1050", "dc1", "10.0.0.1:7000")
    data = json.loads(encode_peer(peer))
    # Gubernator's three fields, as it names them, plus one its JSON decoder skips
    assert data == {
        "data-center": "dc1",
        "http-address": "10.0.0.1:1050",
        "grpc-address": "10.0.0.1:1051",
        "peer-address": "10.0.0.1:7000",
    }
    assert decode_peer(encode_peer(peer)) == peer
    # no peer address: the very bytes a Gubernator node writes, read back without one
    plain = replace(peer, peer_address="")
    assert encode_peer(plain) == (
        b'{"data-center": "dc1", "http-address": "10.0.0.1:1050", "grpc-address": "10.0.0.1:1051"}'
    )
    assert decode_peer(encode_peer(plain)).peer_address == ""


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"\xff\xfe",
        b"[1,2]",
        b'{"grpc-address": 5}',
        b"{",
        b"no-port",
        b'{"grpc-address": "a:1", "peer-address": 7}',
        b'{"grpc-address": "a:1", "peer-address": "no-port"}',
    ],
)
def test_decode_rejects_garbage(garbage: bytes) -> None:
    with pytest.raises(ValueError):
        decode_peer(garbage)


async def test_three_nodes_see_each_other_and_leave(
    etcd_server: EtcdServer, raw: aetcd.Client
) -> None:
    nodes = [node(etcd_server, n) for n in (1, 2, 3)]
    recs = [Recorder() for _ in nodes]
    for disc, rec in zip(nodes, recs, strict=True):
        await disc.start(rec)
    everyone = {"127.0.0.1:1051", "127.0.0.2:1051", "127.0.0.3:1051"}
    for rec in recs:
        await rec.wait_for(everyone)
    # the value under Gubernator's key layout is Gubernator's JSON
    got = await raw.get(f"{PREFIX}127.0.0.1:1050".encode())
    assert got is not None and json.loads(got.value)["grpc-address"] == "127.0.0.1:1051"

    await nodes[2].stop()
    for rec in recs[:2]:
        await rec.wait_for(everyone - {"127.0.0.3:1051"}, timeout=10)
    assert await raw.get(f"{PREFIX}127.0.0.3:1050".encode()) is None
    for disc in nodes[:2]:
        await disc.stop()


async def test_garbage_values_are_counted_and_skipped(
    etcd_server: EtcdServer, raw: aetcd.Client
) -> None:
    disc = node(etcd_server, 1)
    rec = Recorder()
    await disc.start(rec)
    await raw.put(f"{PREFIX}junk".encode(), b"\x00\xffnot json")
    await raw.put(f"{PREFIX}legacy".encode(), b"127.0.0.7:1051")
    await rec.wait_for({"127.0.0.1:1051", "127.0.0.7:1051"})
    assert disc.malformed == 1
    await raw.delete(f"{PREFIX}legacy".encode())
    await rec.wait_for({"127.0.0.1:1051"})
    await disc.stop()


async def test_revoked_lease_is_regranted(etcd_server: EtcdServer, raw: aetcd.Client) -> None:
    a, b = node(etcd_server, 1), node(etcd_server, 2)
    rec_b = Recorder()
    await a.start(Recorder())
    await b.start(rec_b)
    await rec_b.wait_for({"127.0.0.1:1051", "127.0.0.2:1051"})
    first_lease = a.lease_id
    assert first_lease is not None
    seen = len(rec_b.lists)

    await raw.revoke_lease(first_lease)  # as if the lease had expired
    await rec_b.wait_for({"127.0.0.2:1051"}, timeout=10)
    await rec_b.wait_for({"127.0.0.1:1051", "127.0.0.2:1051"}, timeout=10)
    assert len(rec_b.lists) >= seen + 2
    # b may see the new key before a hears etcd's answer to its put
    for _ in range(100):
        if a.registrations >= 2:
            break
        await asyncio.sleep(0.05)
    assert a.registrations >= 2 and a.lease_id != first_lease
    got = await raw.get(f"{PREFIX}127.0.0.1:1050".encode())
    assert got is not None and got.lease == a.lease_id
    await a.stop()
    await b.stop()


async def test_recovers_after_etcd_restart(etcd_server: EtcdServer) -> None:
    a, b = node(etcd_server, 1), node(etcd_server, 2)
    rec_a, rec_b = Recorder(), Recorder()
    await a.start(rec_a)
    await b.start(rec_b)
    await rec_a.wait_for({"127.0.0.1:1051", "127.0.0.2:1051"})
    lease_before = a.lease_id

    assert etcd_server.proc is not None
    etcd_server.proc.kill()  # SIGKILL: no goodbye to the clients
    etcd_server.proc.wait(10)
    etcd_server.proc = None
    await asyncio.sleep(1.0)
    etcd_server.start()

    # both nodes come back with fresh leases, and still see joins and leaves
    c = node(etcd_server, 3)
    rec_c = Recorder()
    await c.start(rec_c)
    everyone = {"127.0.0.1:1051", "127.0.0.2:1051", "127.0.0.3:1051"}
    for rec in (rec_a, rec_b, rec_c):
        await rec.wait_for(everyone, timeout=15)
    for disc in (a, b):
        for _ in range(100):
            if disc.registrations >= 2:
                break
            await asyncio.sleep(0.1)
    assert a.registrations >= 2 and a.lease_id != lease_before
    await b.stop()
    await rec_a.wait_for(everyone - {"127.0.0.2:1051"}, timeout=10)
    await rec_c.wait_for(everyone - {"127.0.0.2:1051"}, timeout=10)
    await a.stop()
    await c.stop()


async def test_etcd_down_at_start_serves_alone_then_joins(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    client_port, peer_port = free_ports(2)
    server = EtcdServer(client_port, peer_port, tmp_path_factory.mktemp("etcd-late"))
    disc = node(server, 1, start_timeout=0.5)
    rec = Recorder()
    await disc.start(rec)
    assert rec.lists == [[PeerInfo("127.0.0.1:1051", "127.0.0.1:1050")]]
    server.start()
    try:
        other = node(server, 2)
        await other.start(Recorder())
        await rec.wait_for({"127.0.0.1:1051", "127.0.0.2:1051"}, timeout=15)
        await other.stop()
        await disc.stop()
    finally:
        server.stop()


async def test_sees_a_gubernator_registration(etcd_server: EtcdServer, raw: aetcd.Client) -> None:
    disc = node(etcd_server, 1)
    rec = Recorder()
    await disc.start(rec)
    # exactly what a Gubernator node writes under the default prefix
    value = b'{"data-center":"","http-address":"10.0.0.5:1050","grpc-address":"10.0.0.5:1051"}'
    lease = await raw.lease(5)
    await raw.put(f"{PREFIX}10.0.0.5:1050".encode(), value, lease=lease)
    await rec.wait_for({"127.0.0.1:1051", "10.0.0.5:1051"})
    assert PeerInfo("10.0.0.5:1051", "10.0.0.5:1050") in rec.lists[-1]
    await lease.revoke()  # the Gubernator node's lease ends: it leaves
    await rec.wait_for({"127.0.0.1:1051"})
    await disc.stop()


async def test_dead_endpoint_is_skipped(etcd_server: EtcdServer) -> None:
    me = PeerInfo("127.0.0.1:1051", "127.0.0.1:1050")
    endpoints = f"127.0.0.1:{free_ports(1)[0]},{etcd_server.endpoint}"
    disc = EtcdDiscovery(me, endpoints, lease_ttl=2, backoff=0.1, timeout=1.0)
    rec = Recorder()
    await disc.start(rec)
    await rec.wait_for({"127.0.0.1:1051"})
    for _ in range(100):
        if disc.registrations:
            break
        await asyncio.sleep(0.05)
    assert disc.registrations == 1
    await disc.stop()


MALFORMED = "smockron_discovery_malformed_total"


async def test_counters_are_per_instance(etcd_server: EtcdServer, raw: aetcd.Client) -> None:
    """Two discoveries in one process, each on its own registry, count apart."""
    registries = [CollectorRegistry(), CollectorRegistry()]
    nodes = [
        EtcdDiscovery(
            f"127.0.0.{n}:1051",
            etcd_server.endpoint,
            key_prefix=f"/c{n}/",
            lease_ttl=2,
            backoff=0.2,
            timeout=2.0,
            registry=registries[n - 1],
        )
        for n in (1, 2)
    ]
    for disc in nodes:
        await disc.start(Recorder())
    await raw.put(b"/c1/junk1", b"{")
    await raw.put(b"/c1/junk2", b"[]")
    await raw.put(b"/c2/junk", b'{"grpc-address": 9}')
    await until(lambda: nodes[0].malformed == 2 and nodes[1].malformed == 1)
    labels = {"mechanism": "etcd"}
    assert registries[0].get_sample_value(MALFORMED, labels) == 2
    assert registries[1].get_sample_value(MALFORMED, labels) == 1
    for disc in nodes:
        await disc.stop()


async def test_two_nodes_meet_at_the_peer_address_their_records_name(
    etcd_server: EtcdServer, raw: aetcd.Client
) -> None:
    """Node B serves PeersV1 away from its gRPC port + 1; only its etcd record says where.
    Each forwards the keys the other owns, and each counts discovery on its own registry
    (shown by its /metrics)."""
    g1, g2, h1, h2, p2 = free_ports(5)
    base = ClusterConfig(peer_probe_interval_ms=50)
    configs = [
        replace(base, grpc_address=f"127.0.0.1:{g1}", http_address=f"127.0.0.1:{h1}"),
        replace(
            base,
            grpc_address=f"127.0.0.1:{g2}",
            http_address=f"127.0.0.1:{h2}",
            peer_address=f"127.0.0.1:{p2}",
        ),
    ]
    servers: list[ClusterServer] = []
    try:
        for config in configs:
            metrics = ClusterMetrics()
            me = PeerInfo(config.advertise, config.http_address, "", config.advertise_peer)
            disc = EtcdDiscovery(
                me,
                etcd_server.endpoint,
                key_prefix="/pair/",
                lease_ttl=2,
                backoff=0.2,
                timeout=2.0,
                registry=metrics.registry,
            )
            servers.append(ClusterServer(config, disc, metrics=metrics))
            await servers[-1].start()
        a, b = servers
        await until(lambda: all(len(s.node.ring.nodes) == 2 for s in servers))
        assert a.node.clients[b.node.address].target == f"127.0.0.1:{p2}"
        assert b.node.clients[a.node.address].target == f"127.0.0.1:{g1 + 1}"
        with socket.socket() as probe:  # nothing at B's gRPC port + 1
            assert probe.connect_ex(("127.0.0.1", g2 + 1)) != 0
        got = await raw.get(f"/pair/127.0.0.1:{h2}".encode())
        assert got is not None and json.loads(got.value)["peer-address"] == f"127.0.0.1:{p2}"

        await assert_each_forwards_to_the_other(a, b)
        for server in servers:
            registry = server.node.metrics.registry
            assert registry.get_sample_value("smockron_cluster_peer_failures_total") == 0

        await raw.put(b"/pair/junk", b"\xff")
        await until(
            lambda: all(
                s.node.metrics.registry.get_sample_value(MALFORMED, {"mechanism": "etcd"}) == 1
                for s in servers
            )
        )
        shown = await asyncio.to_thread(scraped, h1)  # the node's /metrics serves them
        assert shown[(MALFORMED, (("mechanism", "etcd"),))] == 1
    finally:
        for server in servers:
            await server.stop()


async def test_two_processes_find_a_peer_listener_away_from_grpc_plus_one(
    etcd_server: EtcdServer, raw: aetcd.Client, tmp_path: Path
) -> None:
    """End to end through the command line: B's ``--peer-address`` reaches A in B's etcd
    record, A forwards B's keys there, and each process shows its own discovery counters
    on its /metrics."""
    g1, g2, h1, h2, p2 = free_ports(5)
    procs: list[Proc] = []
    with stopping(procs):
        for grpc, http, extra in ((g1, h1, []), (g2, h2, ["--peer-address", f"127.0.0.1:{p2}"])):
            args = [
                "cluster",
                "--grpc-address",
                f"127.0.0.1:{grpc}",
                "--http-address",
                f"127.0.0.1:{http}",
                "--peer-discovery",
                "etcd",
                "--etcd-endpoints",
                etcd_server.endpoint,
                *extra,
            ]
            procs.append(run_smockron(args, tmp_path / f"{grpc}.log"))
        for port in (h1, h2):
            wait_port(port, 20)
        # route=False: every check goes to A, which forwards B's keys (what is tested)
        async with (
            AsyncClient(f"127.0.0.1:{g1}", timeout=5, route=False) as a,
            AsyncClient(f"127.0.0.1:{g2}", timeout=5, route=False) as b,
        ):
            # both: B refuses peer calls from a node it has not yet seen in etcd
            await peer_count_becomes(a, 2)
            await peer_count_becomes(b, 2)
            for i in range(40):
                assert (await a.check("n", f"k{i}", 1, 100, MINUTE)).remaining == 99
        checks = "smockron_cluster_checks_total"
        at_b = await asyncio.to_thread(scraped, h2)
        at_a = await asyncio.to_thread(scraped, h1)
        assert at_b[(checks, (("route", "peer"),))] > 0  # forwarded by A to B's listener
        assert at_a.get((checks, (("route", "owner_failed"),)), 0) == 0
        assert at_a[("smockron_cluster_peer_failures_total", ())] == 0

        await raw.put(b"/gubernator-peersjunk", b"{")
        malformed = ("smockron_discovery_malformed_total", (("mechanism", "etcd"),))
        for port in (h1, h2):
            for _ in range(100):
                if (await asyncio.to_thread(scraped, port)).get(malformed) == 1:
                    break
                await asyncio.sleep(0.05)
            assert (await asyncio.to_thread(scraped, port)).get(malformed) == 1
