"""The client sends each check to the node that owns it: real ``smockron cluster``
processes on loopback (a peers file, so nodes can join and leave), real gRPC, the
nodes' own counters (``/metrics``) as the witness of where each check was decided."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from smockron.cluster.client import (
    MINUTE,
    AsyncClient,
    Client,
    ClientError,
    ClientUnavailable,
    RateLimitResponse,
)
from smockron.cluster.client._routing import Outcome, OwnerRing, Part, Route
from smockron.cluster.model import RateLimitRequest
from smockron.core.hashring import HashRing
from tests.support import (
    Proc,
    cluster_nodes,
    free_ports,
    run_smockron,
    stopping,
    wait_for,
    wait_port,
)

_CHECKS = re.compile(r'^smockron_cluster_checks_total\{route="(\w+)"\} (\S+)$', re.M)


@dataclass
class Cluster:
    addresses: list[str]
    http: dict[str, str]
    procs: dict[str, Proc]
    peers_file: Path

    def list(self, addresses: list[str]) -> None:
        self.peers_file.write_text("\n".join(addresses) + "\n")

    def counts(self) -> dict[str, dict[str, float]]:
        """Each node's checks_total by route."""
        out = {}
        for address, http in self.http.items():
            with urllib.request.urlopen(f"http://{http}/metrics", timeout=5) as resp:
                text = resp.read().decode()
            out[address] = {route: float(v) for route, v in _CHECKS.findall(text)}
        return out


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Four nodes started, the first three listed in the peers file."""
    ports = free_ports(8)
    addresses = [f"127.0.0.1:{p}" for p in ports[:4]]
    http = {a: f"127.0.0.1:{p}" for a, p in zip(addresses, ports[4:], strict=True)}
    peers = tmp_path / "peers"
    found = Cluster(addresses, http, {}, peers)
    found.list(addresses[:3])
    procs: list[Proc] = []
    with stopping(procs):
        for i, address in enumerate(addresses):
            args = [
                "cluster",
                "--grpc-address",
                address,
                "--http-address",
                http[address],
                "--peers-file",
                str(peers),
            ]
            procs.append(run_smockron(args, tmp_path / f"node{i}.log"))
            found.procs[address] = procs[-1]
        for port in ports:
            wait_port(port, timeout=20)
        for address in addresses:
            wait_for(partial(_serves, address, addresses[:3]), timeout=20)
        yield found


def _serves(address: str, listed: list[str]) -> bool:
    """Whether the node at ``address`` answers a HealthCheck that lists the nodes of the
    peers file: a listening port alone does not say the node serves calls yet."""
    try:
        with Client(address, timeout=2, route=False) as client:
            health = client.health_check()
    except ClientError:
        return False
    return health.healthy and set(listed) <= {p.grpc_address for p in health.local_peers}


def _delta(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], route: str
) -> dict[str, int]:
    return {a: int(after[a].get(route, 0) - before[a].get(route, 0)) for a in after}


def _keys_by_owner(ring: HashRing, name: str, n: int) -> dict[str, list[str]]:
    owned: dict[str, list[str]] = {}
    for i in range(n):
        owned.setdefault(ring.owner(f"{name}_k{i}"), []).append(f"k{i}")
    return owned


def test_sync_client_sends_each_check_to_its_owner(cluster: Cluster) -> None:
    three = cluster.addresses[:3]
    owned = _keys_by_owner(HashRing(three), "route_sync", 30)
    assert set(owned) == set(three)  # every node owns some of the keys
    before = cluster.counts()
    with Client(three[0], timeout=5) as client:
        for owner, keys in owned.items():
            for key in keys:
                resp = client.check("route_sync", key, 1, 10, MINUTE)
                assert (resp.remaining, resp.metadata["owner"]) == (9, owner)
        assert client.ring is not None and client.ring.nodes == tuple(sorted(three))
    after = cluster.counts()
    assert _delta(before, after, "local") == {a: len(owned.get(a, [])) for a in cluster.addresses}
    assert set(_delta(before, after, "forwarded").values()) == {0}
    assert set(_delta(before, after, "peer").values()) == {0}


async def test_async_client_splits_a_batch_by_owner(cluster: Cluster) -> None:
    three = cluster.addresses[:3]
    owned = _keys_by_owner(HashRing(three), "route_async", 300)
    reqs = [RateLimitRequest("route_async", f"k{i}", 2, 10, MINUTE) for i in range(300)]
    before = cluster.counts()
    async with AsyncClient(three[1], timeout=5) as client:
        got = await client.get_rate_limits(reqs)
        assert [r.remaining for r in got] == [8] * 300
        ring = HashRing(three)
        assert [r.metadata["owner"] for r in got] == [ring.owner(r.hash_key) for r in reqs]
        one = await client.check("route_async", "k0", 1, 10, MINUTE)
        assert (one.remaining, one.metadata["owner"]) == (7, ring.owner("route_async_k0"))
    after = cluster.counts()
    expected = {a: len(owned.get(a, [])) for a in cluster.addresses}
    expected[ring.owner("route_async_k0")] += 1
    assert _delta(before, after, "local") == expected
    assert set(_delta(before, after, "forwarded").values()) == {0}


def test_client_follows_nodes_joining_and_leaving(cluster: Cluster) -> None:
    a, b, c, d = cluster.addresses
    with Client(a, timeout=5, ring_refresh=0.2) as client:
        client.check("route_join", "warm", 1, 10, MINUTE)
        assert client.ring is not None and client.ring.nodes == tuple(sorted([a, b, c]))

        cluster.list([a, b, c, d])  # d joins
        wait_for(lambda: _nodes_after_check(client) == {a, b, c, d}, timeout=15)
        four = HashRing([a, b, c, d])
        keys = _keys_by_owner(four, "route_join", 60)[d][:5]
        # the nodes have re-read the file too once a's health lists d
        before = cluster.counts()
        for key in keys:
            assert client.check("route_join", key, 1, 10, MINUTE).metadata["owner"] == d
        after = cluster.counts()
        assert _delta(before, after, "local")[d] == len(keys)
        assert set(_delta(before, after, "forwarded").values()) == {0}

        cluster.list([a, c, d])  # b leaves
        wait_for(lambda: _nodes_after_check(client) == {a, c, d}, timeout=15)
        three = HashRing([a, c, d])
        moved = _keys_by_owner(HashRing([a, b, c, d]), "route_leave", 60)[b][:5]
        before = cluster.counts()
        for key in moved:
            owner = client.check("route_leave", key, 1, 10, MINUTE).metadata["owner"]
            assert owner == three.owner(f"route_leave_{key}") != b
        after = cluster.counts()
        assert _delta(before, after, "local")[b] == 0
        assert set(_delta(before, after, "forwarded").values()) == {0}


def _nodes_after_check(client: Client) -> set[str]:
    client.check("route_tick", "k", 0, 10, MINUTE)  # a check is what refreshes the ring
    assert client.ring is not None
    return set(client.ring.nodes)


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_client_falls_back_when_the_owner_is_killed(cluster: Cluster, kind: str) -> None:
    three = cluster.addresses[:3]
    ring = HashRing(three)
    victim = three[2]
    keys = _keys_by_owner(ring, "route_dead", 60)[victim][:3]
    survivors = HashRing(three[:2])
    if kind == "sync":
        with Client(three[0], timeout=5) as client:
            assert client.check("route_dead", keys[0], 1, 10, MINUTE).metadata["owner"] == victim
            cluster.procs[victim].kill()
            for key in keys:
                resp = client.check("route_dead", key, 1, 10, MINUTE)
                assert resp.error == "" and resp.metadata["owner"] != victim
            assert client.ring is not None and victim in client.ring.down
            got = client.get_rate_limits(
                [RateLimitRequest("route_dead", k, 1, 10, MINUTE) for k in keys]
            )
    else:
        async with AsyncClient(three[0], timeout=5) as aclient:
            first = await aclient.check("route_dead", keys[0], 1, 10, MINUTE)
            assert first.metadata["owner"] == victim
            cluster.procs[victim].kill()
            for key in keys:
                resp = await aclient.check("route_dead", key, 1, 10, MINUTE)
                assert resp.error == "" and resp.metadata["owner"] != victim
            assert aclient.ring is not None and victim in aclient.ring.down
            got = await aclient.get_rate_limits(
                [RateLimitRequest("route_dead", k, 1, 10, MINUTE) for k in keys]
            )
    assert all(r.error == "" for r in got)
    # sent to the node that takes the victim's keys over
    assert [r.metadata["owner"] for r in got] == [survivors.owner(f"route_dead_{k}") for k in keys]


def test_client_of_a_single_address_does_not_route_when_told_not_to(cluster: Cluster) -> None:
    three = cluster.addresses[:3]
    owned = _keys_by_owner(HashRing(three), "route_off", 30)
    far = [k for owner, ks in owned.items() if owner != three[0] for k in ks]
    before = cluster.counts()
    with Client(three[0], timeout=5, route=False) as client:
        for key in far:
            client.check("route_off", key, 1, 10, MINUTE)
        assert client.ring is None
    after = cluster.counts()
    assert _delta(before, after, "forwarded")[three[0]] == len(far)


# -- the ring alone, on an injected clock ----------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_owner_ring_refreshes_on_its_timer_and_takes_nodes_back_after_down_for() -> None:
    clock = _Clock()
    ring = OwnerRing(refresh=5.0, down_for=1.0, clock=clock)
    assert ring.owner("x") is None and ring.due()
    assert ring.claim() and not ring.claim()  # one refresher at a time
    ring.learn(["n1", "n2", "n3"])
    assert not ring.due()
    key = next(f"k{i}" for i in range(100) if ring.owner(f"k{i}") == "n2")
    ring.mark_down("n2")
    assert ring.owner(key) in ("n1", "n3")
    clock.now += 1.0
    assert ring.due() and not ring.claim()  # the time-out ended: n2 is back, no refresh
    assert ring.owner(key) == "n2" and not ring.due()
    clock.now += 4.0
    assert ring.due() and ring.claim()
    ring.failed()  # nobody answered: asked again within a second, the ring kept
    assert ring.owner(key) == "n2" and not ring.due()
    clock.now += 1.0
    assert ring.claim()
    ring.learn(["n1", "n3"])
    assert ring.owner(key) in ("n1", "n3")


def test_owner_ring_is_alone_when_only_the_clients_own_node_is_in_it() -> None:
    """Then a check skips the routing (it would go to the client's address anyway)."""
    clock = _Clock()
    ring = OwnerRing(refresh=5.0, down_for=1.0, clock=clock)
    assert ring.alone  # nothing learned: checks go to the client's address
    for nodes, seed, alone in [
        ([], "n1", True),
        (["n1"], "n1", True),
        (["n1"], "x:81", False),  # the one node is not the one the client was given
        (["n1", "n2"], "n1", False),
    ]:
        clock.now += 5.0  # the next refresh is due
        assert ring.claim()
        ring.learn(nodes, seed=seed)
        assert ring.alone is alone, (nodes, seed)
    ring.mark_down("n2")  # n1 is left, the client's own
    assert ring.alone
    clock.now += 1.0
    assert ring.due() and not ring.claim()  # n2 back in the ring
    assert not ring.alone
    ring.mark_down("n1")
    assert not ring.alone  # n2 only, not the client's own node


def _answers(parts: list[Part]) -> list[Outcome]:
    """Each part answered by its owner, as a node names itself in ``owner``."""
    return [
        [
            RateLimitResponse(remaining=int(r.unique_key[1:]), metadata={"owner": owner or "seed"})
            for r in reqs
        ]
        for owner, reqs in parts
    ]


def test_route_splits_by_owner_and_sends_an_unreachable_owners_part_to_the_next() -> None:
    """The one routing path both clients drive (Route), without I/O: a batch split by
    owner, answered in request order; an owner out of reach is marked down and its part
    goes to the keys' next owners; after ``attempts`` owners the error is raised."""
    ring = OwnerRing(clock=_Clock())
    assert ring.claim()
    ring.learn(["n1", "n2", "n3"])
    reqs = [RateLimitRequest("r", f"k{i}", 1, 10, MINUTE) for i in range(30)]
    route = Route(ring, reqs)
    parts = route.parts()
    assert {owner for owner, _ in parts} == {"n1", "n2", "n3"}
    assert all(ring.owner(r.hash_key) == owner for owner, part in parts for r in part)
    down = ClientUnavailable("n2 is down")
    outcomes = [
        down if owner == "n2" else got
        for (owner, _), got in zip(parts, _answers(parts), strict=True)
    ]
    assert not route.take(outcomes)  # n2's keys still to send
    assert "n2" in ring.down
    again = route.parts()
    assert {owner for owner, _ in again} <= {"n1", "n3"}
    assert sum(len(part) for _, part in again) == sum(len(p) for o, p in parts if o == "n2")
    assert route.take(_answers(again))
    assert [a.remaining for a in route.answers] == list(range(30))

    lone = Route(ring, reqs[:1], attempts=2)
    ((first, _),) = lone.parts()
    assert not lone.take([ClientUnavailable(f"{first} is down")])
    ((second, _),) = lone.parts()
    assert second not in (None, first)
    with pytest.raises(ClientUnavailable):
        lone.take([ClientUnavailable(f"{second} is down")])


def test_route_with_fallback_tries_the_given_address_last() -> None:
    """A lone check (``fallback``): its owners, then the address the client was given
    (owner None), which forwards; that one's error is the call's."""
    ring = OwnerRing(clock=_Clock())
    assert ring.claim()
    ring.learn(["n1", "n2", "n3"])
    route = Route(ring, [RateLimitRequest("r", "k7", 1, 10, MINUTE)], fallback=True)
    tried = []
    for _ in range(2):
        ((owner, _),) = route.parts()
        tried.append(owner)
        assert not route.take([ClientUnavailable("down")])
    assert None not in tried and len(set(tried)) == 2
    ((last, part),) = route.parts()
    assert last is None
    assert route.take(_answers([(last, part)]))
    assert route.answers[0].metadata["owner"] == "seed"


def test_owner_ring_switches_to_the_hash_the_nodes_use() -> None:
    clock = _Clock()
    nodes = ["10.0.0.1:1051", "10.0.0.2:1051", "10.0.0.3:1051"]
    theirs = HashRing(nodes, hash="fnv1a")
    ring = OwnerRing(clock=clock)  # fnv1a-mix
    assert ring.claim()
    ring.learn(nodes)
    wrong = [k for k in (f"api_k{i}" for i in range(200)) if ring.owner(k) != theirs.owner(k)]
    assert wrong
    for key in wrong[:10]:
        picked = ring.owner(key)
        assert picked is not None
        ring.observe(key, picked, theirs.owner(key))
    assert ring.due()  # an answer from another owner asks for a refresh at once
    assert ring.claim()
    ring.learn(nodes)
    assert ring.hash == "fnv1a"
    assert all(ring.owner(f"api_k{i}") == theirs.owner(f"api_k{i}") for i in range(200))


def test_client_learns_the_hash_the_nodes_use(tmp_path: Path) -> None:
    """Nodes on Gubernator's bare FNV-1a: the client, on fnv1a-mix, sees answers from
    other owners than it picked and switches to the hash that explains them."""
    with cluster_nodes(tmp_path, "--peer-picker-hash", "fnv1a", nodes=3) as nodes:
        addresses = [n.grpc_address for n in nodes]
        http = {n.grpc_address: f"127.0.0.1:{n.http_port}" for n in nodes}
        found = Cluster(addresses, http, {}, tmp_path / "x")
        with Client(addresses[0], timeout=5) as client:
            keys = iter(range(100_000))

            def switched() -> bool:
                for _ in range(20):
                    client.check("route_hash", f"w{next(keys)}", 1, 10, MINUTE)
                return client.ring is not None and client.ring.hash == "fnv1a"

            wait_for(switched, timeout=20)
            theirs = HashRing(addresses, hash="fnv1a")
            before = found.counts()
            for i in range(30):
                resp = client.check("route_hash", f"k{i}", 1, 10, MINUTE)
                assert resp.metadata["owner"] == theirs.owner(f"route_hash_k{i}")
            after = found.counts()
        assert set(_delta(before, after, "forwarded").values()) == {0}
        assert sum(_delta(before, after, "local").values()) == 30
