"""A recorder for discovery callbacks, shared by the discovery tests."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from smockron.cluster.client import AsyncClient
from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.model import RateLimitRequest
from smockron.cluster.server import ClusterServer


class Recorder:
    """Collects every list ``on_change`` receives; awaits a wanted set of addresses."""

    def __init__(self) -> None:
        self.lists: list[list[PeerInfo]] = []

    def __call__(self, peers: list[PeerInfo]) -> None:
        self.lists.append(peers)

    @property
    def addresses(self) -> set[str]:
        return {p.grpc_address for p in self.lists[-1]} if self.lists else set()

    async def wait_for(self, wanted: set[str], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.addresses != wanted:
            if time.monotonic() > deadline:
                raise AssertionError(f"peers {self.addresses} never became {wanted}")
            await asyncio.sleep(0.02)


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def assert_each_forwards_to_the_other(a: ClusterServer, b: ClusterServer) -> None:
    """Hits on keys the other node owns are answered by it and counted there (a failed
    forward would be answered locally, leaving the owner's count untouched)."""
    await until(lambda: len(a.node.ring.nodes) == 2 and len(b.node.ring.nodes) == 2)
    for src, dst in ((a, b), (b, a)):
        pool = (f"k{i}" for i in range(2000))
        keys = [k for k in pool if src.node.ring.owner(f"n_{k}") == dst.node.address][:10]
        answers = await src.node.get_rate_limits([_request(k, 1) for k in keys])
        assert {r.metadata["owner"] for r in answers} == {dst.node.address}
        held = await dst.node.get_rate_limits([_request(k, 0) for k in keys])
        assert [r.remaining for r in held] == [99] * len(keys)


def _request(key: str, hits: int) -> RateLimitRequest:
    return RateLimitRequest("n", key, hits, 100, 60_000)


async def peer_count_becomes(client: AsyncClient, count: int) -> None:
    """Wait until the node's HealthCheck counts ``count`` peers."""
    seen = -1
    for _ in range(150):
        seen = (await client.health_check()).peer_count
        if seen == count:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"peer count stayed {seen}, expected {count}")


def scraped(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A node's /metrics on its HTTP port: (sample name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
