"""A lone check for another node, through the native gRPC server, is forwarded from the
gRPC thread as it came (api.forward_now) rather than through the event loop's batcher,
and the owner's answer relayed to the caller by the extensions; if that call fails the
batched path decides it. Two real nodes in this process, real
gRPC between them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import grpc
import pytest

from smockron.cluster import api, peers
from smockron.cluster.config import ClusterConfig
from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc
from smockron.cluster.server import ClusterServer
from smockron.cluster.transports import native
from smockron.core.hashring import HashRing
from tests.support import free_ports

pytestmark = pytest.mark.skipif(
    not native.AVAILABLE or peers._nativeclient is None,
    reason="the native server and client channel are not built",
)


relays = pytest.mark.skipif(
    peers._nativeclient is not None and not hasattr(peers._nativeclient.Channel, "relay"),
    reason="_nativeclient built before Channel.relay: rebuild it (setup.py build_ext)",
)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[ClusterServer, ClusterServer]]:
    g1, g2 = free_ports(2)
    base = ClusterConfig(
        http_address="", grpc_server="native", batch_timeout_ms=5000, peer_down_after=1000
    )
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
    server.node.count_relayed()  # as /metrics does before it is read
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


@relays
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
    # each check counted once: the two the owner answered as forwarded, the three whose
    # relay failed only as decided here (not also as forwarded when their relay started)
    assert _count(a, "forwarded") == 2
    assert a.node.clients[b.node.address].consecutive_failures >= 3


class _CountingRing(HashRing):
    """The node's ring, counting its owner lookups (what forward_now costs a call)."""

    __slots__ = ("lookups",)

    def __init__(self, nodes: list[str]) -> None:
        super().__init__(nodes)
        self.lookups = 0

    def owner(self, key: str | bytes) -> str:
        self.lookups += 1
        return super().owner(key)


async def test_a_call_owned_here_costs_one_lookup(
    pair: tuple[ClusterServer, ClusterServer],
) -> None:
    """forward_now stops at the first item this node owns (or at a second owner): a call
    this node answers itself pays one ring lookup there, not one per item."""
    a = pair[0]
    ring = _CountingRing(list(a.node.ring.nodes))
    a.node.ring = ring
    here = [k for k in (f"k{i}" for i in range(500)) if ring.owner(f"fn_{k}") == a.node.address]
    there = [k for k in (f"k{i}" for i in range(500)) if ring.owner(f"fn_{k}") != a.node.address]

    def call(keys: list[str]) -> pb.GetRateLimitsReq:
        return pb.GetRateLimitsReq(
            requests=[
                pb.RateLimitReq(name="fn", unique_key=k, hits=1, limit=5, duration=60_000)
                for k in keys
            ]
        )

    for keys in (here[:100], there[:1] + here[:99]):
        ring.lookups = 0
        assert api.forward_now(a.node, call(keys), None) is None
        assert ring.lookups == (1 if keys[0] in here else 2)
    ring.lookups = 0
    api.forward_now(a.node, call(there[:50]), None)  # all b's: every item is looked up
    assert ring.lookups == 50


def _blocking_check(address: str, key: str) -> Any:
    with grpc.insecure_channel(address) as channel:
        stub: Any = gubernator_pb2_grpc.V1Stub(channel)  # type: ignore[no-untyped-call]
        req = pb.RateLimitReq(name="fn", unique_key=key, hits=1, limit=5, duration=60_000)
        return stub.GetRateLimits(pb.GetRateLimitsReq(requests=[req]), timeout=10).responses[0]


@relays
async def test_the_owners_answer_is_relayed_without_the_event_loop(
    pair: tuple[ClusterServer, ClusterServer],
) -> None:
    """Both nodes share this process's event loop; it is kept busy while a forwarded
    check is made, and the answer still arrives: the forwarding node's gRPC thread sent
    it, the owner's gRPC thread decided it, and the extensions relayed it."""
    a, b = pair
    theirs = [f"k{i}" for i in range(1000) if a.node.ring.owner(f"fn_k{i}") == b.node.address]
    await _checks(a.node.address, theirs[:1])  # the channel is watched: relays on
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(_blocking_check, a.node.address, theirs[1])
        started = time.monotonic()
        while not answer.done() and time.monotonic() - started < 5:
            time.sleep(0.01)  # the loop stays blocked meanwhile
        assert answer.done(), "the forwarded check waited for the event loop"
        got = answer.result()
    assert (got.error, got.remaining, got.metadata["owner"]) == ("", 4, b.node.address)
    assert _count(a, "forwarded") == 2
    native = a.node.clients[b.node.address]._native
    assert native is not None and native.channel.relays == 0


@relays
async def test_a_relay_answered_while_its_peers_client_closes_counts_once(
    pair: tuple[ClusterServer, ClusterServer],
) -> None:
    """The owner leaves the ring while a check relayed to it is in flight: its client's
    close waits for that relay, the owner's answer reaches the caller, and the check
    counts as forwarded, once, though the client is gone from the node's peers."""
    a, b = pair
    theirs = [f"k{i}" for i in range(1000) if a.node.ring.owner(f"fn_k{i}") == b.node.address]
    await _checks(a.node.address, theirs[:1])  # batched; the channel is watched: relays on
    decide = b.node.answer_here

    def slow(*args: Any, **kwargs: Any) -> Any:  # on b's gRPC thread: the owner is slow
        time.sleep(0.3)
        return decide(*args, **kwargs)

    b.node.answer_here = slow  # type: ignore[method-assign]
    native = a.node.clients[b.node.address]._native
    assert native is not None
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(_blocking_check, a.node.address, theirs[1])
        deadline = time.monotonic() + 5
        while native.channel.relays == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        assert native.channel.relays == 1
        a.node.set_peers([PeerInfo(a.node.address)])  # b leaves: its client closes
        assert b.node.address not in a.node.clients
        while not answer.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        got = answer.result(timeout=0)
    assert (got.error, got.remaining, got.metadata["owner"]) == ("", 4, b.node.address)
    while a.node._tasks and time.monotonic() < deadline:  # the close of b's client
        await asyncio.sleep(0.01)
    assert not a.node._tasks and native.channel.relays == 0
    assert _count(a, "forwarded") == 2


@relays
async def test_an_answer_with_the_wrong_item_count_is_not_relayed() -> None:
    """An owner whose answer does not hold one item per request (here: none) is not
    relayed to the client: the batched path decides the check, as for a failed call."""
    g1, g2 = free_ports(2)
    owner = grpc.aio.server()
    answered: list[bytes] = []

    async def empty(request: bytes, context: Any) -> bytes:
        answered.append(request)
        return b""  # a GetPeerRateLimitsResp without items

    async def live(request: bytes, context: Any) -> bytes:
        return b""

    methods = {
        "GetPeerRateLimits": grpc.unary_unary_rpc_method_handler(empty),
        "LiveCheck": grpc.unary_unary_rpc_method_handler(live),
    }
    owner.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler("pb.gubernator.PeersV1", methods),
            grpc.method_handlers_generic_handler("pb.gubernator.V1", methods),
        )
    )
    owner.add_insecure_port(f"127.0.0.1:{g2}")
    await owner.start()
    config = ClusterConfig(
        http_address="",
        grpc_server="native",
        grpc_address=f"127.0.0.1:{g1}",
        peers_on_grpc_port=True,
        batch_timeout_ms=5000,
        peer_down_after=1000,
        peer_check_address=False,
    )
    a = ClusterServer(config)
    await a.start()
    a.node.set_peers([PeerInfo(config.grpc_address), PeerInfo(f"127.0.0.1:{g2}")])
    try:
        theirs = [f"k{i}" for i in range(1000) if a.node.ring.owner(f"fn_k{i}") != a.node.address]
        answers = await _checks(a.node.address, theirs[:3])
        assert [(r.error, r.remaining) for r in answers] == [("", 4)] * 3
        assert {r.metadata["owner"] for r in answers} == {a.node.address}  # answered here
        # the first went batched (the channel is watched from then on); each of the
        # others was relayed, refused, then sent batched: two calls to the owner
        assert len(answered) == 5
        assert _count(a, "owner_failed") == 3
    finally:
        await a.stop()
        await owner.stop(None)
