"""The client against a real three-node ``python -m smockron cluster`` on loopback."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from smockron.cluster.client import (
    MINUTE,
    AsyncClient,
    Client,
    ClientUnavailable,
    ItemError,
)
from smockron.cluster.model import Algorithm, Behavior, RateLimitRequest, Status
from smockron.core.hashring import HashRing
from tests.support import Proc, cluster_nodes


@dataclass
class Nodes:
    addresses: list[str]
    procs: list[Proc]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    with cluster_nodes(tmp_path_factory.mktemp("client-cluster"), nodes=3) as ns:
        yield Nodes([n.grpc_address for n in ns], [n.proc for n in ns])


def test_sync_client_shares_one_limit_across_nodes(nodes: Nodes) -> None:
    clients = [Client(a, timeout=5) for a in nodes.addresses]
    try:
        got = [clients[i % 3].check("client_rps", "acct:1", 1, 5, MINUTE) for i in range(7)]
    finally:
        for c in clients:
            c.close()
    assert [r.remaining for r in got] == [4, 3, 2, 1, 0, 0, 0]
    assert [r.status for r in got] == [Status.UNDER_LIMIT] * 5 + [Status.OVER_LIMIT] * 2
    owners = {r.metadata.get("owner") for r in got}
    assert len(owners) == 1 and owners <= set(nodes.addresses)
    now_ms = time.time() * 1000
    assert now_ms < got[0].reset_time <= now_ms + MINUTE


async def test_async_client_batches_errors_and_health(nodes: Nodes) -> None:
    async with AsyncClient(nodes.addresses[1], timeout=5) as client:
        health = await client.health_check()
        assert health.healthy, health.message
        assert (health.peer_count, health.advertise_address) == (3, nodes.addresses[1])
        assert sorted(p.grpc_address for p in health.local_peers) == sorted(nodes.addresses)
        assert health.region_peers == ()
        await client.live_check()

        reqs = [
            RateLimitRequest(
                "client_batch",
                f"k{i}",
                hits=1 + i % 3,
                limit=10,
                duration=MINUTE,
                algorithm=Algorithm(i % 2),
                behavior=Behavior(i % 2),
            )
            for i in range(2500)
        ]
        got = await client.get_rate_limits(reqs)
        assert [r.remaining for r in got] == [10 - (1 + i % 3) for i in range(2500)]
        assert all(not r.error for r in got)

        with pytest.raises(ItemError, match="client_bad"):
            await client.check("client_bad", "k", 1, 10, -5)


async def test_dead_node_is_unavailable_others_answer(nodes: Nodes) -> None:
    ring = HashRing(nodes.addresses)
    victim, victim_address = nodes.procs[2], nodes.addresses[2]
    keys = [f"k{i}" for i in range(1000) if ring.owner(f"client_rr_k{i}") != victim_address]
    async with AsyncClient(nodes.addresses, timeout=5) as spread:  # round-robin, all three
        for key in keys[:6]:
            assert (await spread.check("client_rr", key, 1, 10, MINUTE)).remaining == 9
        victim.kill()
        async with AsyncClient(victim_address, timeout=2) as dead:
            with pytest.raises(ClientUnavailable):
                await dead.health_check()
        # the balanced client routes around the dead node: every call is answered
        for key in keys[6:26]:
            resp = await spread.check("client_rr", key, 1, 10, MINUTE)
            assert (resp.remaining, resp.error) == (9, "")
