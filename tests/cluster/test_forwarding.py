"""Two real nodes in one process (real gRPC between them): batching, GLOBAL calls, recovery."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import pytest

from smockron.cluster.config import ClusterConfig
from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.model import Behavior, RateLimitRequest, Status
from smockron.cluster.server import ClusterServer
from tests.support import free_ports


class Pair:
    def __init__(self, a: ClusterServer, b: ClusterServer) -> None:
        self.a, self.b = a, b

    def keys_owned_by(self, server: ClusterServer, n: int) -> list[str]:
        ring = self.a.node.ring
        pool = (f"k{i}" for i in range(100_000))
        return [k for k in pool if ring.owner(f"n_{k}") == server.node.address][:n]


def make_config(**kw: Any) -> tuple[ClusterConfig, ClusterConfig]:
    g1, g2 = free_ports(2)
    base = ClusterConfig(http_address="", peer_probe_interval_ms=50, **kw)
    return (
        replace(base, grpc_address=f"127.0.0.1:{g1}"),
        replace(base, grpc_address=f"127.0.0.1:{g2}"),
    )


async def start_pair(ca: ClusterConfig, cb: ClusterConfig) -> Pair:
    peers = [PeerInfo(ca.grpc_address), PeerInfo(cb.grpc_address)]
    a, b = ClusterServer(ca), ClusterServer(cb)
    for server in (a, b):
        await server.start()
        server.node.set_peers(peers)
    return Pair(a, b)


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    p = await start_pair(*make_config(global_sync_wait_ms=10, global_batch_limit=2))
    try:
        yield p
    finally:
        await p.a.stop()
        await p.b.stop()


def req(key: str, hits: int = 1, behavior: Behavior = Behavior.BATCHING) -> RateLimitRequest:
    return RateLimitRequest("n", key, hits, 100, 60_000, behavior=behavior)


async def test_batching_joins_concurrent_calls(pair: Pair) -> None:
    keys = pair.keys_owned_by(pair.b, 20)
    resps = await asyncio.gather(*(pair.a.node.get_rate_limits([req(k)]) for k in keys))
    assert [r[0].remaining for r in resps] == [99] * 20
    assert {r[0].metadata["owner"] for r in resps} == {pair.b.node.address}
    assert pair.a.node.clients[pair.b.node.address]._batcher.batches_sent == 1


async def test_no_batching_sends_each_call_at_once(pair: Pair) -> None:
    keys = pair.keys_owned_by(pair.b, 5)
    await asyncio.gather(
        *(pair.a.node.get_rate_limits([req(k, behavior=Behavior.NO_BATCHING)]) for k in keys)
    )
    assert pair.a.node.clients[pair.b.node.address]._batcher.batches_sent == 0
    check = await pair.b.node.get_rate_limits([req(k, hits=0) for k in keys])
    assert [r.remaining for r in check] == [99] * 5


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_global_hits_and_broadcasts_in_batches(pair: Pair) -> None:
    keys = pair.keys_owned_by(pair.b, 5)
    g = Behavior.GLOBAL
    # first request per key: forwarded to the owner synchronously, seeds A's replica
    first = await pair.a.node.get_rate_limits([req(k, 10, g) for k in keys])
    assert [r.remaining for r in first] == [90] * 5
    # then answered from the replica, hits sent in the background
    second = await pair.a.node.get_rate_limits([req(k, 5, g) for k in keys])
    assert [r.remaining for r in second] == [85] * 5
    owner_sync = pair.b.node.global_sync
    await wait_until(lambda: pair.a.node.global_sync.hits_sent >= 5)
    b_state = await pair.b.node.get_rate_limits([req(k, 0) for k in keys])
    assert [r.remaining for r in b_state] == [85] * 5
    # the owner's broadcasts: 5 keys at global_batch_limit 2 -> calls of 2, 2, 1
    await wait_until(lambda: owner_sync.broadcasts_sent >= 3)
    # B's own GLOBAL hits reach A's replica through a broadcast
    await pair.b.node.get_rate_limits([req(keys[0], 20, g)])
    await wait_until(
        lambda: (r := pair.a.node.replicas.get(f"n_{keys[0]}")) is not None and r.remaining == 65
    )
    over = await pair.a.node.get_rate_limits([req(keys[0], 66, g)])
    assert over[0].status == Status.OVER_LIMIT and over[0].remaining <= 65


async def test_owner_holds_a_loan_for_a_busy_non_owner_and_drops_it_when_idle(pair: Pair) -> None:
    key = pair.keys_owned_by(pair.b, 1)[0]
    g, hash_key = Behavior.GLOBAL, f"n_{key}"
    await pair.a.node.get_rate_limits([req(key, 10, g)])  # forwarded: B lends A a share
    lent = pair.b.node.ledger.reserved(hash_key, pair.b.node._clock())
    replica = pair.a.node.replicas.get(hash_key)
    assert replica is not None and 0 < lent == replica.budget < 90
    # B's own clients may use only what is not lent to A
    refused = await pair.b.node.get_rate_limits([req(key, 91 - lent, g)])
    assert (refused[0].status, refused[0].remaining) == (Status.OVER_LIMIT, 90 - lent)
    # A asked for nothing for a sync wait (10 ms): it gives the loan back
    await wait_until(lambda: pair.b.node.ledger.reserved(hash_key, pair.b.node._clock()) == 0)
    taken = await pair.b.node.get_rate_limits([req(key, 90, g)])
    assert (taken[0].status, taken[0].remaining) == (Status.UNDER_LIMIT, 0)


async def test_dead_peer_is_routed_around_and_comes_back() -> None:
    ca, cb = make_config()
    pair = await start_pair(ca, cb)
    try:
        key = pair.keys_owned_by(pair.b, 1)[0]
        await pair.b.stop()
        for _ in range(3):  # peer_down_after
            assert pair.a.node.down == set()
            resp = await pair.a.node.get_rate_limits([req(key)])
            assert (resp[0].error, resp[0].metadata["owner"]) == ("", pair.a.node.address)
        assert pair.a.node.down == {pair.b.node.address}
        assert pair.a.node.ring.nodes == (pair.a.node.address,)
        status, message, count, _ = pair.a.node.health()
        assert (status, count) == ("unhealthy", 2) and pair.b.node.address in message
        revived = ClusterServer(cb)
        await revived.start()
        revived.node.set_peers([PeerInfo(ca.grpc_address), PeerInfo(cb.grpc_address)])
        try:  # (it knows A from its peer list: PeersV1 is served to members only)
            await wait_until(lambda: not pair.a.node.down)
            again = await pair.a.node.get_rate_limits([req(key)])
            assert again[0].metadata["owner"] == pair.b.node.address
        finally:
            await revived.stop()
    finally:
        await pair.a.stop()


async def test_global_owner_death_is_noticed_by_the_hit_sync() -> None:
    ca, cb = make_config(global_sync_wait_ms=10)
    pair = await start_pair(ca, cb)
    try:
        key = pair.keys_owned_by(pair.b, 1)[0]
        g = Behavior.GLOBAL
        first = await pair.a.node.get_rate_limits([req(key, 1, g)])
        assert first[0].metadata["owner"] == pair.b.node.address
        await pair.b.stop()
        from_replica = await pair.a.node.get_rate_limits([req(key, 1, g)])
        assert (from_replica[0].error, from_replica[0].remaining) == ("", 98)
        for _ in range(50):  # traffic keeps the hit sync failing until B is routed around
            if pair.a.node.down:
                break
            answer = await pair.a.node.get_rate_limits([req(key, 1, g)])
            assert answer[0].error == ""
            await asyncio.sleep(0.02)
        assert pair.a.node.down == {pair.b.node.address}
        local = await pair.a.node.get_rate_limits([req(key, 1, g)])
        assert (local[0].error, local[0].metadata["owner"]) == ("", pair.a.node.address)
    finally:
        await pair.a.stop()


async def test_nearly_used_up_keys_sync_sooner() -> None:
    ca, cb = make_config(global_sync_wait_ms=1600)
    pair = await start_pair(ca, cb)
    try:
        calm, tight = pair.keys_owned_by(pair.b, 2)
        g = Behavior.GLOBAL
        await pair.a.node.get_rate_limits([req(calm, 1, g), req(tight, 1, g)])  # seed replicas
        sync = pair.a.node.global_sync
        await pair.a.node.get_rate_limits([req(calm, 1, g)])  # 98 left: no hurry
        await asyncio.sleep(0.4)
        assert sync.hits_sent == 0
        replica = pair.a.node.replicas.get(f"n_{tight}")
        assert replica is not None and replica.budget > 10  # B lent A a share of 99
        spend = replica.budget - 5
        await pair.a.node.get_rate_limits([req(tight, spend, g)])  # 5 of the budget left: hurry
        await wait_until(lambda: sync.hits_sent == 2, timeout=0.9)
        state = await pair.b.node.get_rate_limits([req(tight, 0), req(calm, 0)])
        assert [r.remaining for r in state] == [99 - spend, 98]
    finally:
        await pair.a.stop()
        await pair.b.stop()


class _SlowDiscovery:
    """Lists the peers only when the test says so."""

    def __init__(self, peers: list[PeerInfo]) -> None:
        self.peers = peers
        self.release = asyncio.Event()

    async def start(self, on_change: Callable[[list[PeerInfo]], None]) -> None:
        await self.release.wait()
        on_change(self.peers)

    async def stop(self) -> None:
        pass


async def test_node_takes_no_call_before_it_knows_its_peers() -> None:
    """A node that answered before discovery listed its peers would count keys it does
    not own, so it does not listen until the first list is in."""
    ca, cb = make_config()
    discovery = _SlowDiscovery([PeerInfo(ca.grpc_address), PeerInfo(cb.grpc_address)])
    server = ClusterServer(ca, discovery)
    starting = asyncio.create_task(server.start())
    try:
        await asyncio.sleep(0.3)
        host, port = ca.grpc_address.rsplit(":", 1)
        with pytest.raises(OSError):
            _, writer = await asyncio.open_connection(host, int(port))
            writer.close()
        assert not starting.done()
        discovery.release.set()
        await asyncio.wait_for(starting, 10)
        _, writer = await asyncio.open_connection(host, int(port))
        writer.close()
        assert set(server.node.ring.nodes) == {ca.grpc_address, cb.grpc_address}
    finally:
        discovery.release.set()
        await starting
        await server.stop()
