"""Three real ``python -m smockron cluster`` processes on loopback with static peers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc
from smockron.core.hashring import HashRing
from tests.support import Proc, cluster_nodes


@dataclass
class Cluster:
    addresses: list[str]
    http_ports: list[int]
    procs: list[Proc]

    def stub(self, channel: grpc.aio.Channel) -> Any:
        return gubernator_pb2_grpc.V1Stub(channel)  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def start_cluster(tmp: Path, *extra: str, nodes: int = 3) -> Iterator[Cluster]:
    with cluster_nodes(tmp, *extra, nodes=nodes) as ns:
        yield Cluster([n.grpc_address for n in ns], [n.http_port for n in ns], [n.proc for n in ns])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with start_cluster(tmp_path_factory.mktemp("cluster"), "--global-sync-wait", "20ms") as c:
        yield c


def req(key: str, hits: int = 1, limit: int = 10, behavior: int = 0, **kw: Any) -> pb.RateLimitReq:
    return pb.RateLimitReq(
        name="t",
        unique_key=key,
        hits=hits,
        limit=limit,
        duration=60_000,
        behavior=behavior,  # type: ignore[arg-type]
        **kw,
    )


@pytest.mark.parametrize("behavior", [pb.BATCHING, pb.NO_BATCHING])
async def test_same_key_via_any_node_counts_once(cluster: Cluster, behavior: int) -> None:
    key = f"acct-{behavior}"
    channels = [grpc.aio.insecure_channel(a) for a in cluster.addresses]
    try:
        stubs = [cluster.stub(c) for c in channels]
        seen = []
        for i in range(12):
            resp = await stubs[i % 3].GetRateLimits(
                pb.GetRateLimitsReq(requests=[req(key, behavior=behavior)])
            )
            r = resp.responses[0]
            seen.append((r.status, r.remaining, r.metadata["owner"], r.error))
    finally:
        for c in channels:
            await c.close(None)
    expected_owner = HashRing(cluster.addresses).owner(f"t_{key}")
    assert [s[:2] for s in seen] == [(pb.UNDER_LIMIT, 9 - i) for i in range(10)] + [
        (pb.OVER_LIMIT, 0)
    ] * 2
    assert {s[2] for s in seen} == {expected_owner}
    assert {s[3] for s in seen} == {""}


async def test_many_keys_in_one_call_are_routed_and_ordered(cluster: Cluster) -> None:
    ring = HashRing(cluster.addresses)
    by_owner: dict[str, list[str]] = {a: [] for a in cluster.addresses}
    for i in range(5000):
        key = f"multi-{i}"
        by_owner[ring.owner(f"t_{key}")].append(key)
    keys = [k for group in zip(*by_owner.values(), strict=False) for k in group][:60]
    async with grpc.aio.insecure_channel(cluster.addresses[1]) as channel:
        stub = cluster.stub(channel)
        resp = await stub.GetRateLimits(
            pb.GetRateLimitsReq(requests=[req(k, hits=i % 4, limit=5) for i, k in enumerate(keys)])
        )
    assert [r.remaining for r in resp.responses] == [5 - (i % 4) for i in range(60)]
    assert [r.metadata["owner"] for r in resp.responses] == [ring.owner(f"t_{k}") for k in keys]
    assert len({r.metadata["owner"] for r in resp.responses}) == 3


async def test_health_reports_three_peers(cluster: Cluster) -> None:
    async with grpc.aio.insecure_channel(cluster.addresses[2]) as channel:
        health = await cluster.stub(channel).HealthCheck(pb.HealthCheckReq())
    assert (health.status, health.peer_count, health.advertise_address) == (
        "healthy",
        3,
        cluster.addresses[2],
    )


async def global_round_robin(
    cluster: Cluster, key: str, limit: int, total: int, rate: float
) -> tuple[int, int]:
    """Send ``total`` single hits round-robin at ``rate``/s: (admitted, refused while fewer
    than ``limit`` had been admitted). The exact oracle admits the first ``limit``."""
    channels = [grpc.aio.insecure_channel(a) for a in cluster.addresses]
    stubs = [cluster.stub(c) for c in channels]
    admitted = early = 0
    try:
        start = time.monotonic()
        for i in range(total):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            resp = await stubs[i % 3].GetRateLimits(
                pb.GetRateLimitsReq(requests=[req(key, limit=limit, behavior=pb.GLOBAL)]),
                timeout=5,
            )
            assert resp.responses[0].error == ""
            if resp.responses[0].status == pb.UNDER_LIMIT:
                admitted += 1
            elif admitted < limit:
                early += 1
    finally:
        for c in channels:
            await c.close(None)
    return admitted, early


async def checks_by_route(cluster: Cluster) -> dict[str, float]:
    """``smockron_cluster_checks_total`` of every node, summed per route."""
    totals: dict[str, float] = {}
    async with aiohttp.ClientSession() as session:
        for port in cluster.http_ports:
            async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                text = await resp.text()
            for line in text.splitlines():
                if line.startswith("smockron_cluster_checks_total{"):
                    route = line.split('route="', 1)[1].split('"', 1)[0]
                    totals[route] = totals.get(route, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


@pytest.mark.parametrize("limit", [40, 100])
async def test_global_accuracy_against_exact_oracle(cluster: Cluster, limit: int) -> None:
    """Round-robin at 5x the limit within one window over three nodes: the exact oracle
    admits ``limit``; GLOBAL may over-admit at most 5 %, and refuse few too early. The
    non-owners answer from their replicas: at most their first request waits for the owner."""
    key, total = f"global-acc-{limit}", 5 * limit
    owner = cluster.addresses.index(HashRing(cluster.addresses).owner(f"t_{key}"))
    to_owner = len(range(owner, total, 3))
    before = await checks_by_route(cluster)
    admitted, early = await global_round_robin(cluster, key, limit, total, rate=500)
    after = await checks_by_route(cluster)
    print(f"GLOBAL: admitted {admitted} of {total}, oracle {limit}, early refusals {early}")
    assert limit * 0.95 <= admitted <= limit * 1.05
    assert early <= limit * 0.1
    delta = {route: after[route] - before.get(route, 0) for route in after}
    assert delta["local"] == to_owner
    # at most the first request of each non-owner (none when a broadcast came first)
    forwarded = delta.get("forwarded", 0)
    assert forwarded <= 2
    assert delta["global_replica"] == total - to_owner - forwarded


async def test_global_state_reaches_every_node(cluster: Cluster) -> None:
    key = "global-bcast"
    async with grpc.aio.insecure_channel(cluster.addresses[0]) as ch0:
        await cluster.stub(ch0).GetRateLimits(
            pb.GetRateLimitsReq(requests=[req(key, hits=7, behavior=pb.GLOBAL)])
        )
    deadline = time.monotonic() + 5
    remaining: list[int] = []
    while time.monotonic() < deadline:
        remaining = []
        for address in cluster.addresses:
            async with grpc.aio.insecure_channel(address) as ch:
                resp = await cluster.stub(ch).GetRateLimits(
                    pb.GetRateLimitsReq(requests=[req(key, hits=0, behavior=pb.GLOBAL)])
                )
                remaining.append(resp.responses[0].remaining)
        if remaining == [3, 3, 3]:
            break
        await asyncio.sleep(0.05)
    assert remaining == [3, 3, 3]


async def test_killing_the_owner_under_load(tmp_path: Path) -> None:
    with start_cluster(tmp_path) as cluster:
        ring = HashRing(cluster.addresses)
        victim = cluster.addresses[0]
        keys = [k for k in (f"load-{i}" for i in range(20_000)) if ring.owner(f"t_{k}") == victim][
            :10
        ]
        assert len(keys) == 10
        survivors = cluster.addresses[1:]
        channels = [grpc.aio.insecure_channel(a) for a in survivors]
        stubs = [cluster.stub(c) for c in channels]
        answered: list[tuple[float, str, str]] = []
        failures: list[str] = []
        killed_at: list[float] = []

        async def load(worker: int) -> None:
            end = time.monotonic() + 3.0
            n = 0
            while time.monotonic() < end and n < 3000:
                n += 1
                key = keys[n % len(keys)]
                try:
                    resp = await stubs[(worker + n) % 2].GetRateLimits(
                        pb.GetRateLimitsReq(requests=[req(key, limit=1_000_000)]), timeout=3
                    )
                except grpc.aio.AioRpcError as exc:
                    failures.append(f"{exc.code().name}: {exc.details()}")
                    continue
                r = resp.responses[0]
                if r.error:
                    failures.append(r.error)
                answered.append((time.monotonic(), r.metadata["owner"], r.error))
                await asyncio.sleep(0.002)

        async def kill() -> None:
            await asyncio.sleep(1.0)
            killed_at.append(time.monotonic())
            await asyncio.to_thread(cluster.procs[0].kill)

        try:
            await asyncio.gather(kill(), *(load(w) for w in range(4)))
            async with grpc.aio.insecure_channel(survivors[0]) as ch:
                health = await cluster.stub(ch).HealthCheck(pb.HealthCheckReq())
        finally:
            for c in channels:
                await c.close(None)
    assert failures == []
    before = [a for a in answered if a[0] < killed_at[0]]
    after = [a for a in answered if a[0] > killed_at[0] + 0.5]
    assert before and {a[1] for a in before} == {victim}
    assert len(after) > 50
    assert victim not in {a[1] for a in after}
    assert {a[1] for a in after} <= set(survivors)
    assert health.status == "unhealthy" and victim in health.message
    assert health.peer_count == 3


async def test_http_gateway_of_every_node_forwards(cluster: Cluster) -> None:
    ring = HashRing(cluster.addresses)
    key = next(
        k
        for k in (f"http-{i}" for i in range(10_000))
        if ring.owner(f"t_{k}") == cluster.addresses[0]
    )
    body = {
        "requests": [
            {"name": "t", "uniqueKey": key, "hits": "2", "limit": "10", "duration": "60000"}
        ]
    }
    remaining = []
    async with aiohttp.ClientSession() as session:
        for port in cluster.http_ports:
            url = f"http://127.0.0.1:{port}/v1/GetRateLimits"
            async with session.post(url, json=body) as resp:
                assert resp.status == 200
                item = (await resp.json())["responses"][0]
            assert item["metadata"] == {"owner": cluster.addresses[0]}
            remaining.append(item["remaining"])
    assert remaining == ["8", "6", "4"]
