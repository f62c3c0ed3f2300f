"""Gubernator's own functional tests, ported as black-box tests against real
``smockron cluster`` processes.

Each test is named after the upstream test it ports (``functional_test.go`` and
``interval_test.go`` of github.com/gubernator-io/gubernator) and replays its request
tables: the facts (requests, expected remaining and status) are upstream's, the code is
ours. The clients are stubs generated at test time from the .proto files kept in
``smockron/cluster/proto/`` (not smockron's committed ``pb`` modules), so the nodes are
spoken to as any Gubernator client would.

Upstream freezes the daemons' clock in-process (``clock.Freeze``/``clock.Advance``); a
black box cannot, so these tests freeze time the way a client can: every request carries
``created_at`` from a test clock, which the node uses as that request's time. The test
clock starts a few seconds in the future so the nodes' own clocks (which run the expiry
sweep) never pass it during a test.

Where smockron differs from Gubernator on purpose the test asserts smockron's answer and
says why; docs/cluster.md (compatibility notes) and docs/algorithms.md (deliberate
differences) list each. Upstream assertions on Gubernator's own Prometheus metric names
(``gubernator_broadcast_duration_count`` ...) are not ported: smockron exports its own.
"""

from __future__ import annotations

import importlib
import json
import random
import string
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from smockron.cluster.config import peer_address_of
from smockron.core.hashring import HashRing
from tests.cluster.test_cluster import Cluster, start_cluster
from tests.support import REPO_ROOT, EtcdServer, Proc, free_ports, stopping, wait_port

PROTO_DIR = REPO_ROOT / "smockron" / "cluster" / "proto"
SECOND, MINUTE = 1000, 60_000
GREGORIAN_MINUTES, GREGORIAN_HOURS, GREGORIAN_DAYS = 0, 1, 2
GREGORIAN_MONTHS, GREGORIAN_YEARS = 4, 5
SYNC_WAIT = "20ms"


# -- stubs generated now from the repo's .proto files -------------------------------------


@dataclass(frozen=True)
class Api:
    pb: ModuleType
    grpc: ModuleType
    peers_pb: ModuleType
    peers_grpc: ModuleType


def generate_stubs(out: Path) -> Api:
    from grpc_tools import protoc  # type: ignore[import-untyped]  # test-time only

    protos = [str(PROTO_DIR / name) for name in ("gubernator.proto", "peers.proto")]
    args = ["protoc", f"-I{PROTO_DIR}", f"--python_out={out}", f"--grpc_python_out={out}"]
    assert protoc.main([*args, *protos]) == 0
    sys.path.insert(0, str(out))
    try:
        names = ("gubernator_pb2", "gubernator_pb2_grpc", "peers_pb2", "peers_pb2_grpc")
        return Api(*(importlib.import_module(name) for name in names))
    finally:
        sys.path.remove(str(out))


# -- the cluster and its clients ----------------------------------------------------------


@dataclass
class Guber:
    """A running cluster seen through the generated stubs."""

    cluster: Cluster
    api: Api
    channels: dict[str, grpc.Channel] = field(default_factory=dict)

    @property
    def addresses(self) -> list[str]:
        return self.cluster.addresses

    def channel(self, address: str) -> grpc.Channel:
        if address not in self.channels:
            self.channels[address] = grpc.insecure_channel(address)
        return self.channels[address]

    def v1(self, address: str) -> Any:
        return self.api.grpc.V1Stub(self.channel(address))

    def owner(self, name: str, key: str) -> str:
        return HashRing(self.addresses).owner(f"{name}_{key}")

    def non_owners(self, name: str, key: str) -> list[str]:
        owner = self.owner(name, key)
        return [a for a in self.addresses if a != owner]

    def check(self, address: str, **fields: Any) -> Any:
        """One request through ``address``; its one response."""
        req = self.api.pb.GetRateLimitsReq(requests=[self.api.pb.RateLimitReq(**fields)])
        resp = self.v1(address).GetRateLimits(req, timeout=10)
        assert len(resp.responses) == 1
        return resp.responses[0]

    def eventually(self, address: str, expected: int, timeout: float = 5.0, **fields: Any) -> Any:
        """Query (0 hits) through ``address`` until ``remaining`` is ``expected``: the
        black-box form of upstream's waitForBroadcast."""
        deadline = time.monotonic() + timeout
        while True:
            resp = self.check(address, **{**fields, "hits": 0})
            if resp.remaining == expected or time.monotonic() > deadline:
                return resp
            time.sleep(0.02)

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Api:
    return generate_stubs(tmp_path_factory.mktemp("upstream_stubs"))


@contextmanager
def running(tmp: Path, api: Api, *flags: str) -> Iterator[Guber]:
    """Three real nodes started with ``flags``, seen through the generated stubs."""
    with start_cluster(tmp, *flags) as cluster:
        nodes = Guber(cluster, api)
        try:
            yield nodes
        finally:
            nodes.close()


@pytest.fixture(scope="module")
def guber(tmp_path_factory: pytest.TempPathFactory, api: Api) -> Iterator[Guber]:
    with running(tmp_path_factory.mktemp("conformance"), api, "--global-sync-wait", SYNC_WAIT) as g:
        yield g


class Clock:
    """The frozen clock of a test: requests carry ``created_at=clock.now``."""

    def __init__(self, ahead_ms: int = 10 * SECOND) -> None:
        now = time.time_ns() // 1_000_000
        self.now = (now + ahead_ms) // SECOND * SECOND  # a whole second, as upstream's

    def advance(self, ms: int) -> None:
        self.now += ms


def random_key() -> str:
    return "".join(random.choices(string.ascii_letters + string.digits, k=10))


def next_minute() -> int:
    """Epoch ms of a whole minute at least 5 s ahead: a calendar window the test owns."""
    now = time.time_ns() // 1_000_000
    return ((now + 5 * SECOND) // MINUTE + 1) * MINUTE


# -- functional_test.go: one node's arithmetic, through any node -------------------------


def test_TestOverTheLimit(guber: Guber) -> None:
    pb = guber.api.pb
    for remaining, status in ((1, pb.UNDER_LIMIT), (0, pb.UNDER_LIMIT), (0, pb.OVER_LIMIT)):
        rl = guber.check(
            guber.addresses[1],
            name="test_over_limit",
            unique_key="account:1234",
            algorithm=pb.TOKEN_BUCKET,
            duration=9 * SECOND,
            limit=2,
            hits=1,
        )
        assert (rl.status, rl.remaining, rl.limit) == (status, remaining, 2)
        assert rl.reset_time != 0


def test_TestMultipleAsync(guber: Guber) -> None:
    """Two items in one call, both owned by other nodes (upstream picks its keys for
    that; we search for such keys), answered in order."""
    pb, asked = guber.api.pb, guber.addresses[0]
    name = "test_multiple_async"
    keys = [k for k in (f"account:{i}" for i in range(1000)) if guber.owner(name, k) != asked]
    first, second = (
        keys[0],
        next(k for k in keys if guber.owner(name, k) != guber.owner(name, keys[0])),
    )
    req = pb.GetRateLimitsReq(
        requests=[
            pb.RateLimitReq(
                name=name,
                unique_key=first,
                algorithm=pb.TOKEN_BUCKET,
                duration=9 * SECOND,
                limit=2,
                hits=1,
            ),
            pb.RateLimitReq(
                name=name,
                unique_key=second,
                algorithm=pb.TOKEN_BUCKET,
                duration=9 * SECOND,
                limit=10,
                hits=5,
            ),
        ]
    )
    resp = guber.v1(asked).GetRateLimits(req, timeout=10)
    assert [(r.status, r.remaining, r.limit) for r in resp.responses] == [
        (pb.UNDER_LIMIT, 1, 2),
        (pb.UNDER_LIMIT, 5, 10),
    ]
    assert {r.metadata["owner"] for r in resp.responses} == {
        guber.owner(name, first),
        guber.owner(name, second),
    }


Step = tuple[int, int, int, int]
"""(hits, expected remaining, expected status, then advance the clock by ms)."""


def run_steps(
    guber: Guber,
    address: str,
    clock: Clock,
    steps: list[Step],
    check: Callable[[Any, Clock], None] = lambda rl, clock: None,
    **fields: Any,
) -> None:
    for i, (hits, remaining, status, sleep) in enumerate(steps):
        rl = guber.check(address, hits=hits, created_at=clock.now, **fields)
        assert rl.error == "", i
        assert (rl.status, rl.remaining, rl.limit) == (status, remaining, fields["limit"]), i
        assert rl.reset_time != 0, i
        check(rl, clock)
        clock.advance(sleep)


U, OVER = 0, 1  # Status.UNDER_LIMIT, Status.OVER_LIMIT (the enum values of the .proto)


def test_TestTokenBucket(guber: Guber) -> None:
    steps = [(1, 1, U, 0), (1, 0, U, 100), (1, 1, U, 0)]
    run_steps(
        guber,
        guber.addresses[2],
        Clock(),
        steps,
        name="test_token_bucket",
        unique_key="account:1234",
        algorithm=0,
        duration=5,
        limit=2,
    )


def test_TestTokenBucketGregorian(guber: Guber) -> None:
    clock = Clock()
    clock.now = next_minute() + 1  # a minute of our own, just ahead of the nodes' clocks
    steps = [(1, 59, U, 0), (1, 58, U, 0), (58, 0, U, 0), (1, 0, OVER, 61 * SECOND), (0, 60, U, 0)]
    run_steps(
        guber,
        guber.addresses[1],
        clock,
        steps,
        name="test_token_bucket_greg",
        unique_key="account:12345",
        behavior=4,
        algorithm=0,
        duration=GREGORIAN_MINUTES,
        limit=60,
    )


def test_TestTokenBucketNegativeHits(guber: Guber) -> None:
    steps = [(-1, 3, U, 0), (-1, 4, U, 0), (4, 0, U, 0), (-1, 1, U, 0)]
    run_steps(
        guber,
        guber.addresses[0],
        Clock(),
        steps,
        name="test_token_bucket_negative",
        unique_key="account:12345",
        algorithm=0,
        duration=5,
        limit=2,
    )


@pytest.mark.parametrize("algorithm", [0, 1], ids=["TOKEN_BUCKET", "LEAKY_BUCKET"])
def test_TestDrainOverLimit(guber: Guber, algorithm: int) -> None:
    steps = [(0, 10, U, 0), (1, 9, U, 0), (100, 0, OVER, 0), (0, 0, U, 0)]
    run_steps(
        guber,
        guber.addresses[0],
        Clock(),
        steps,
        name="test_drain_over_limit",
        unique_key=f"account:1234:{algorithm}",
        algorithm=algorithm,
        behavior=32,
        duration=30 * SECOND,
        limit=10,
    )


MORE_THAN_AVAILABLE = [
    (1000, 1000, U, 0),
    (1500, 1000, OVER, 0),  # asks more than is left: nothing is taken
    (500, 500, U, 0),
    (400, 100, U, 0),
    (100, 0, U, 0),
    (1, 0, OVER, 0),
]


def test_TestTokenBucketRequestMoreThanAvailable(guber: Guber) -> None:
    run_steps(
        guber,
        guber.addresses[1],
        Clock(),
        MORE_THAN_AVAILABLE,
        name="test_token_more_than_available",
        unique_key="account:123456",
        algorithm=0,
        duration=1000,
        limit=2000,
    )


def test_TestLeakyBucketRequestMoreThanAvailable(guber: Guber) -> None:
    run_steps(
        guber,
        guber.addresses[2],
        Clock(),
        MORE_THAN_AVAILABLE,
        name="test_leaky_more_than_available",
        unique_key="account:123456",
        algorithm=1,
        duration=1000,
        limit=2000,
    )


def leaky_reset(top: int) -> Callable[[Any, Clock], None]:
    """Upstream asserts reset_time == now + (limit - remaining) * 3 s: its bucket counts
    whole tokens. smockron keeps the fraction of a token and answers when the bucket is
    really full again (docs/algorithms.md, difference 10), so its reset_time lies within
    the token before upstream's figure, and equals it when no fraction is left. ``top`` is
    what the bucket fills up to (the burst; upstream counts to ``limit``)."""

    def check(rl: Any, clock: Clock) -> None:
        upstream = clock.now + (top - rl.remaining) * 3 * SECOND
        assert upstream - 3 * SECOND < rl.reset_time <= upstream

    return check


def test_TestLeakyBucket(guber: Guber) -> None:
    steps = [
        (1, 9, U, SECOND),  # first hit
        (1, 8, U, SECOND),  # second hit; no leak
        (1, 7, U, 1500),  # third hit; no leak
        (0, 8, U, 3 * SECOND),  # should leak one hit 3 seconds after first hit
        (0, 9, U, 0),  # 3 seconds later we should have leaked another hit
        (9, 0, U, 0),  # max out our bucket and sleep for 3 seconds
        (1, 0, OVER, 3 * SECOND),  # should be over the limit
        (0, 1, U, 60 * SECOND),  # should have leaked 1 hit
        (0, 10, U, 60 * SECOND),  # should max out the limit
        (10, 0, U, 29 * SECOND),  # use up the limit, wait until 1 s before the duration
        (9, 0, U, 3 * SECOND),  # use up all hits one second before the duration
        (1, 0, U, SECOND),  # only have 1 hit remaining
    ]
    run_steps(
        guber,
        guber.addresses[0],
        Clock(),
        steps,
        leaky_reset(10),
        name="test_leaky_bucket",
        unique_key="account:1234",
        algorithm=1,
        duration=30 * SECOND,
        limit=10,
    )


def test_TestLeakyBucketWithBurst(guber: Guber) -> None:
    steps = [
        (1, 19, U, SECOND),
        (1, 18, U, SECOND),
        (1, 17, U, 1500),
        (0, 18, U, 3 * SECOND),
        (0, 19, U, 0),
        (19, 0, U, 0),
        (1, 0, OVER, 3 * SECOND),
        (0, 1, U, 60 * SECOND),
        (0, 20, U, SECOND),
    ]
    run_steps(
        guber,
        guber.addresses[0],
        Clock(),
        steps,
        leaky_reset(20),
        name="test_leaky_bucket_with_burst",
        unique_key="account:1234",
        algorithm=1,
        duration=30 * SECOND,
        limit=10,
        burst=20,
    )


def test_TestLeakyBucketGregorian(guber: Guber) -> None:
    clock = Clock()
    clock.now = next_minute() + 1
    start = clock.now
    steps = [(1, 59, U, 500), (1, 58, U, 1200), (1, 58, U, 0)]  # the third leaks one hit
    run_steps(
        guber,
        guber.addresses[0],
        clock,
        steps,
        lambda rl, c: _after(rl.reset_time, start),
        name="TestLeakyBucketGregorian",
        unique_key=random_key(),
        behavior=4,
        algorithm=1,
        duration=GREGORIAN_MINUTES,
        limit=60,
    )


def _after(reset_time: int, start: int) -> None:
    assert reset_time > start


def test_TestLeakyBucketNegativeHits(guber: Guber) -> None:
    steps = [(1, 9, U, 0), (-1, 10, U, 0), (10, 0, U, 0), (-1, 1, U, 0)]

    def exact(rl: Any, clock: Clock) -> None:  # whole tokens only: upstream's figure exactly
        assert rl.reset_time == clock.now + (10 - rl.remaining) * 3 * SECOND

    run_steps(
        guber,
        guber.addresses[0],
        Clock(),
        steps,
        exact,
        name="test_leaky_bucket_negative",
        unique_key="account:12345",
        algorithm=1,
        duration=30 * SECOND,
        limit=10,
    )


def test_TestMissingFields(guber: Guber) -> None:
    cases = [
        (
            dict(
                name="test_missing_fields", unique_key="account:1234", hits=1, limit=10, duration=0
            ),
            "",
            U,
        ),
        (
            dict(
                name="test_missing_fields",
                unique_key="account:12345",
                hits=1,
                duration=10000,
                limit=0,
            ),
            "",
            OVER,
        ),
        (
            dict(unique_key="account:1234", hits=1, duration=10000, limit=5),
            "field 'namespace' cannot be empty",
            U,
        ),
        (
            dict(name="test_missing_fields", hits=1, duration=10000, limit=5),
            "field 'unique_key' cannot be empty",
            U,
        ),
    ]
    for i, (fields, error, status) in enumerate(cases):
        rl = guber.check(guber.addresses[i % 3], **fields)
        assert (rl.error, rl.status) == (error, status), i


def test_TestChangeLimit(guber: Guber) -> None:
    cases = [  # (algorithm, limit, expected remaining); one hit each, all UNDER_LIMIT
        (0, 100, 99),
        (0, 100, 98),
        (0, 10, 7),  # the limit drops by 90: remaining 98 - 90 = 8, then the hit
        (0, 10, 6),
        (0, 200, 195),
        (1, 100, 99),  # another algorithm: a fresh bucket
        (1, 10, 9),  # the burst (the limit) drops to 10: the bucket is clamped, then the hit
        (1, 10, 8),
    ]
    clock = Clock()
    for i, (algorithm, limit, remaining) in enumerate(cases):
        rl = guber.check(
            guber.addresses[1],
            name="test_change_limit",
            unique_key="account:1234",
            algorithm=algorithm,
            duration=9000,
            limit=limit,
            hits=1,
            created_at=clock.now,
        )
        assert (rl.status, rl.remaining, rl.limit) == (U, remaining, limit), i
        assert rl.reset_time != 0


def test_TestResetRemaining(guber: Guber) -> None:
    cases = [(0, 99), (0, 98), (8, 100), (0, 99)]  # (behavior, remaining); 8: RESET_REMAINING
    for i, (behavior, remaining) in enumerate(cases):
        rl = guber.check(
            guber.addresses[2],
            name="test_reset_remaining",
            unique_key="account:1234",
            algorithm=0,
            duration=9000,
            behavior=behavior,
            limit=100,
            hits=1,
        )
        assert (rl.status, rl.remaining, rl.limit) == (U, remaining, 100), i


def test_TestLeakyBucketDivBug(api: Api, tmp_path: Path) -> None:
    """A rate of 0.5 ms per token. Both requests carry a ``created_at`` half a second
    behind the nodes' clocks (upstream freezes the clock instead): the key must survive
    until created_at + duration, not only until its bucket is full again (1 ms later).
    On a fresh cluster, so nothing else in the owner's cache shields the key from the
    expiry sweep. The clock runs here: the tokens leaked between the two calls (two a
    millisecond, at most what passed around them) are allowed for, and the test is tried
    on fresh keys until the two calls took under half a millisecond, when it is exact."""
    with start_cluster(tmp_path) as cluster:
        guber = Guber(cluster, api)
        try:
            for _attempt in range(5):
                created_at = time.time_ns() // 1_000_000 - 500
                fields = dict(
                    name="TestLeakyBucketDivBug",
                    unique_key=random_key(),
                    algorithm=1,
                    duration=1000,
                    limit=2000,
                    created_at=created_at,
                )
                address = random.choice(guber.addresses)
                started = time.monotonic()
                rl = guber.check(address, hits=1, **fields)
                assert (rl.error, rl.status, rl.remaining, rl.limit) == ("", U, 1999, 2000)
                rl = guber.check(address, hits=100, **fields)  # should result in a rate of 0.5
                leaked = int((time.monotonic() - started) * 1000 * 2)
                assert rl.limit == 2000
                assert 1899 <= rl.remaining <= min(2000, 1999 + leaked) - 100, leaked
                if leaked == 0:
                    break
        finally:
            guber.close()


def test_TestGetPeerRateLimits(guber: Guber) -> None:
    """PeersV1.GetPeerRateLimits keeps the order of the items, batches of 1 to 1,000."""
    api = guber.api
    # PeersV1 is on each node's peer listener (gRPC port + 1), not on the client port
    target = peer_address_of(random.choice(guber.addresses))
    stub = api.peers_grpc.PeersV1Stub(guber.channel(target))
    created_at = time.time_ns() // 1_000_000
    for n in (1, 2, 5, 10, 100, 1000):
        req = api.peers_pb.GetPeerRateLimitsReq(
            requests=[
                api.pb.RateLimitReq(
                    name="TestGetPeerRateLimits",
                    unique_key=random_key(),
                    hits=0,
                    limit=1000 + i,
                    duration=1000,
                    algorithm=0,
                    behavior=0,
                    created_at=created_at,
                )
                for i in range(n)
            ]
        )
        resp = stub.GetPeerRateLimits(req, timeout=10)
        assert [r.limit for r in resp.rate_limits] == [1000 + i for i in range(n)]


# -- health and the HTTP gateway -----------------------------------------------------------


def test_TestHealthCheck(api: Api, tmp_path: Path) -> None:
    """Every node is healthy and lists every node as a local peer (one data center:
    a static peer list carries no data center; test_TestHealthCheck_data_centers
    covers upstream's two data centers with etcd discovery). Then the cluster stops and
    HealthCheck fails to connect."""
    with start_cluster(tmp_path) as cluster:
        channels = [grpc.insecure_channel(a) for a in cluster.addresses]
        try:
            for address, channel in zip(cluster.addresses, channels, strict=True):
                stub = api.grpc.V1Stub(channel)
                resp = stub.HealthCheck(api.pb.HealthCheckReq(), timeout=10)
                assert resp.status == "healthy", resp.message
                assert resp.peer_count == 3 and resp.advertise_address == address
                assert sorted(p.grpc_address for p in resp.local_peers) == sorted(cluster.addresses)
                assert {p.data_center for p in resp.local_peers} == {""}
                assert list(resp.region_peers) == []
            for proc in cluster.procs:
                proc.stop()
            for channel in channels:
                with pytest.raises(grpc.RpcError) as failed:
                    api.grpc.V1Stub(channel).HealthCheck(api.pb.HealthCheckReq(), timeout=5)
                assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            for channel in channels:
                channel.close()


def test_TestHealthCheck_data_centers(api: Api, tmp_path: Path, etcd_server: EtcdServer) -> None:
    """Upstream's data-center half of TestHealthCheck, with etcd discovery (whose
    registrations carry a data center): two nodes in the unnamed data center, one in
    "one". Each node lists the nodes of its own data center, itself included, as local
    peers and the others as region peers; peer_count counts both."""
    nodes = [("", "none-a"), ("", "none-b"), ("one", "one-a")]
    procs: list[Proc] = []
    with stopping(procs):
        centers: dict[str, str] = {}
        for center, label in nodes:
            g, h = free_ports(2)
            address = f"127.0.0.1:{g}"
            etcd = ["--peer-discovery", "etcd", "--etcd-endpoints", etcd_server.endpoint]
            args = [
                "env",
                f"GUBER_DATA_CENTER={center}",
                sys.executable,
                "-m",
                "smockron",
                "cluster",
                "--grpc-address",
                address,
                "--http-address",
                f"127.0.0.1:{h}",
                *etcd,
            ]
            procs.append(Proc(args, tmp_path / f"{label}.log"))
            wait_port(g, 20)
            centers[address] = center
        for address, center in centers.items():
            with grpc.insecure_channel(address) as channel:
                stub = api.grpc.V1Stub(channel)
                deadline = time.monotonic() + 15
                resp = stub.HealthCheck(api.pb.HealthCheckReq(), timeout=5)
                while resp.peer_count < 3 and time.monotonic() < deadline:
                    time.sleep(0.1)
                    resp = stub.HealthCheck(api.pb.HealthCheckReq(), timeout=5)
            assert (resp.status, resp.peer_count) == ("healthy", 3), resp.message
            local = sorted((p.grpc_address, p.data_center) for p in resp.local_peers)
            region = sorted((p.grpc_address, p.data_center) for p in resp.region_peers)
            assert local == sorted((a, c) for a, c in centers.items() if c == center)
            assert region == sorted((a, c) for a, c in centers.items() if c != center)
            assert address in {a for a, _ in local}


def test_TestGRPCGateway(guber: Guber) -> None:
    api, port = guber.api, guber.cluster.http_ports[1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/HealthCheck", timeout=10) as r:
        assert r.status == 200
        body = r.read().decode()
    # future upgrades must not turn under_score into camelCase
    for name in ("peer_count", "local_peers", "region_peers"):
        assert name in body
    health = json_format.Parse(body, api.pb.HealthCheckResp())
    assert health.peer_count == 3
    assert sorted((p.grpc_address, p.data_center) for p in health.local_peers) == sorted(
        (a, "") for a in guber.addresses
    )
    assert list(health.region_peers) == []
    assert json.loads(body)["region_peers"] == []  # present though empty, as upstream's

    # the body a Go client's protojson.Marshal sends: camelCase names, int64 as strings
    payload = json_format.MessageToJson(
        api.pb.GetRateLimitsReq(
            requests=[
                api.pb.RateLimitReq(
                    name="TestGRPCGateway", unique_key=random_key(), duration=1000, hits=1, limit=10
                )
            ]
        )
    )
    post = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/GetRateLimits",
        data=payload.encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(post, timeout=10) as r:
        assert r.status == 200
        resp = json_format.Parse(r.read(), api.pb.GetRateLimitsResp())
    assert len(resp.responses) == 1 and resp.responses[0].status == U


# -- GLOBAL ---------------------------------------------------------------------------------


def global_fields(name: str, key: str, **fields: Any) -> dict[str, Any]:
    return dict(name=name, unique_key=key, behavior=2, **fields)


def test_TestGlobalRateLimits(guber: Guber) -> None:
    """Upstream uses five non-owners; with three nodes, its peers[i] is our non-owner
    i % 2. The first four steps agree; at the fourth, a non-owner whose replica came from
    the owner's broadcast (no loan) may spend only an equal share of the remaining,
    ceil(2 / 3) = 1, so it refuses 2 hits that upstream admits (docs/cluster.md: a
    non-owner admits only its budget). Upstream's fifth step depends on that admission."""
    name, key = "TestGlobalRateLimits", random_key()
    peers = guber.non_owners(name, key)
    fields = global_fields(name, key, algorithm=0, duration=3 * MINUTE, limit=5)
    reset_times: set[int] = set()

    def send(address: str, hits: int, remaining: int, status: int) -> None:
        rl = guber.check(address, hits=hits, **fields)
        assert (rl.error, rl.remaining, rl.status, rl.limit) == ("", remaining, status, 5)
        assert rl.metadata["owner"] == guber.owner(name, key)
        reset_times.add(rl.reset_time)

    send(peers[0], 1, 4, U)  # the first hit goes to the owner
    send(peers[0], 2, 2, U)  # answered from the replica, as if this node owned it
    assert guber.eventually(peers[1], 2, **fields).remaining == 2  # the broadcast arrived
    send(peers[1], 0, 2, U)
    send(peers[0], 0, 2, U)
    send(peers[1], 2, 1, OVER)  # upstream: UNDER_LIMIT, 0 (see the docstring)
    assert len(reset_times) == 1  # reset_time does not change during the test


def test_TestGlobalRateLimitsWithLoadBalancing(guber: Guber) -> None:
    name, key = "TestGlobalRateLimitsWithLoadBalancing", random_key()
    targets = [guber.owner(name, key), guber.non_owners(name, key)[0]]
    fields = global_fields(name, key, algorithm=0, duration=5 * MINUTE, limit=2, hits=1)
    for i in range(2):  # deplete the limit through the owner and a non-owner
        rl = guber.check(targets[i % 2], **fields)
        assert (rl.error, rl.status) == ("", U), i
    guber.eventually(targets[1], 0, **fields)
    for i in range(2, 11):  # every later hit is over the limit, on either node
        rl = guber.check(targets[i % 2], **fields)
        assert (rl.error, rl.status) == ("", OVER), i


def test_TestGlobalRateLimitsPeerOverLimit(guber: Guber) -> None:
    """The last step differs on purpose: upstream's token bucket keeps OVER_LIMIT in the
    key and reports it for a later query; smockron reports each request's own status, and a
    query is always UNDER_LIMIT (docs/algorithms.md, difference 1)."""
    name, key = "TestGlobalRateLimitsPeerOverLimit", random_key()
    peer = guber.non_owners(name, key)[0]
    fields = global_fields(name, key, algorithm=0, duration=5 * MINUTE, limit=2)
    got = []
    for hits in (1, 1):
        rl = guber.check(peer, hits=hits, **fields)
        got.append((rl.error, rl.status, rl.remaining))
    assert got == [("", U, 1), ("", U, 0)]
    guber.eventually(guber.owner(name, key), 0, **fields)
    rl = guber.check(peer, hits=1, **fields)
    assert (rl.error, rl.status, rl.remaining) == ("", OVER, 0)
    rl = guber.check(peer, hits=0, **fields)
    assert (rl.error, rl.status, rl.remaining) == ("", U, 0)  # upstream: OVER_LIMIT


def test_TestGlobalRequestMoreThanAvailable(guber: Guber) -> None:
    """Upstream lets every non-owner admit 50 of a limit of 100 from its own copy and
    says so: the cluster over-consumes by up to the remaining times the number of nodes.
    smockron's non-owners admit only the budget their owner lends them (here an equal
    share of 100 over 3 nodes, 34), so both 50-hit requests are refused and nothing is
    over-consumed; the owner's count is untouched (docs/cluster.md, GLOBAL)."""
    name, key = "TestGlobalRequestMoreThanAvailable", random_key()
    peers = guber.non_owners(name, key)
    fields = global_fields(name, key, algorithm=1, duration=1000 * MINUTE, limit=100)
    for peer in peers:  # connect and fill each replica first, as upstream does
        rl = guber.check(peer, hits=0, **fields)
        assert (rl.error, rl.status, rl.remaining) == ("", U, 100)
    for peer in peers:
        rl = guber.check(peer, hits=50, **fields)
        assert (rl.error, rl.status, rl.remaining) == ("", OVER, 34)  # upstream: UNDER_LIMIT
    assert guber.check(guber.owner(name, key), hits=0, **fields).remaining == 100


def test_TestGlobalNegativeHits(guber: Guber) -> None:
    """Steps one and two are upstream's: a give-back through the owner (3), then through
    another non-owner's replica, which raises it above the limit as the owner does (4).
    Step three differs on purpose: 4 hits at a node whose budget is an equal share of the
    remaining, ceil(4 / 3) = 2, are refused (docs/cluster.md), so the last query sees 4."""
    name, key = "TestGlobalNegativeHits", random_key()
    peers = guber.non_owners(name, key)
    fields = global_fields(name, key, algorithm=0, duration=100 * MINUTE, limit=2)
    # peers[1] holds a replica before the test, so its give-back is answered from it
    assert guber.check(peers[1], hits=0, **fields).remaining == 2
    rl = guber.check(peers[0], hits=-1, **fields)
    assert (rl.error, rl.status, rl.remaining) == ("", U, 3)
    assert guber.eventually(peers[1], 3, **fields).remaining == 3  # waitForBroadcast
    rl = guber.check(peers[1], hits=-1, **fields)
    assert (rl.error, rl.status, rl.remaining) == ("", U, 4)
    assert guber.eventually(peers[0], 4, **fields).remaining == 4
    rl = guber.check(peers[0], hits=4, **fields)
    assert (rl.error, rl.status, rl.remaining) == ("", OVER, 2)  # upstream: UNDER_LIMIT, 0
    assert guber.eventually(peers[1], 4, **fields).remaining == 4  # upstream: 0


def test_TestGlobalResetRemaining(guber: Guber) -> None:
    """RESET_REMAINING through a non-owner goes to the owner and reaches the other
    replicas. (Upstream's own assertions here compare an int with an int64 and always
    pass; we assert the values.) A non-owner's second 50 hits wait for its replica, as
    upstream's waitForBroadcast does, and are refused for lack of budget (see
    test_TestGlobalRequestMoreThanAvailable)."""
    name, key = "TestGlobalResetRemaining", random_key()
    peers = guber.non_owners(name, key)
    fields = global_fields(name, key, algorithm=1, duration=1000 * MINUTE, limit=100)
    rl = guber.check(peers[0], hits=50, **fields)  # no replica anywhere: the owner decides
    assert (rl.error, rl.status, rl.remaining) == ("", U, 50)
    assert guber.eventually(peers[1], 50, **fields).remaining == 50
    rl = guber.check(peers[1], hits=50, **fields)
    assert (rl.error, rl.status, rl.remaining) == ("", OVER, 17)  # ceil(50 / 3)
    reset = global_fields(name, key, algorithm=1, duration=1000 * MINUTE, limit=100)
    reset["behavior"] = 2 | 8  # GLOBAL | RESET_REMAINING
    rl = guber.check(peers[0], hits=0, **reset)
    assert (rl.error, rl.remaining) == ("", 100)
    assert guber.eventually(peers[1], 100, **fields).remaining == 100


@pytest.mark.parametrize(
    ("where", "hits"),
    [
        ("owner", 1),
        ("owner", 10),
        ("non-owner", 1),
        ("non-owner", 10),
        ("distributed", 2),
        ("distributed", 10),
        ("distributed", 100),
    ],
)
def test_TestGlobalBehavior(guber: Guber, where: str, hits: int) -> None:
    """Hits on the owner, on one non-owner, or spread concurrently over the non-owners
    (upstream: "Distributed hits"); then every node reports the same remaining. The
    counts of broadcasts and peer calls upstream reads from its own metrics are not
    ported."""
    name, key = f"TestGlobalBehavior/{where}/{hits}", f"account:{random.getrandbits(32):08x}"
    limit, owner, peers = 1000, guber.owner(name, key), guber.non_owners(name, key)
    fields = global_fields(
        name,
        key,
        algorithm=0,
        duration=3 * MINUTE,
        limit=limit,
        created_at=time.time_ns() // 1_000_000,
    )
    if where == "distributed":
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda i: guber.check(peers[i % 2], hits=1, **fields), range(hits)))
        assert {(rl.error, rl.status) for rl in got} == {("", U)}
    else:
        target = owner if where == "owner" else peers[0]
        for i in range(hits):
            rl = guber.check(target, hits=1, **fields)
            assert (rl.error, rl.status, rl.remaining) == ("", U, limit - 1 - i), i
    for address in guber.addresses:
        rl = guber.eventually(address, limit - hits, **fields)
        assert (rl.status, rl.remaining) == (U, limit - hits), address


# -- GLOBAL as Gubernator answers it (--global-mode gubernator) ----------------------------
#
# With ``--global-mode gubernator`` a non-owner answers a key it has not heard of from a
# fresh local bucket and then spends the whole remaining it last heard of, as Gubernator
# does: upstream's GLOBAL tests pass as written (peers[i] is our non-owner i % 2). The
# sync wait is long enough that a broadcast cannot overtake the steps upstream runs
# back to back.


@pytest.fixture(scope="module")
def guber_compat(tmp_path_factory: pytest.TempPathFactory, api: Api) -> Iterator[Guber]:
    tmp = tmp_path_factory.mktemp("conformance_gubernator_mode")
    with running(tmp, api, "--global-sync-wait", "300ms", "--global-mode", "gubernator") as g:
        yield g


def _sender(guber: Guber, fields: dict[str, Any]) -> Callable[[str, int, int, int], Any]:
    def send(address: str, hits: int, remaining: int, status: int) -> Any:
        rl = guber.check(address, hits=hits, **fields)
        assert (rl.error, rl.remaining, rl.status) == ("", remaining, status), (address, hits)
        return rl

    return send


def test_TestGlobalRateLimits_gubernator_mode(guber_compat: Guber) -> None:
    guber = guber_compat
    name, key = "TestGlobalRateLimits", random_key()
    peers = guber.non_owners(name, key)
    fields = global_fields(name, key, algorithm=0, duration=3 * MINUTE, limit=5)
    send = _sender(guber, fields)
    got = [send(peers[0], 1, 4, U)]  # a fresh local bucket, hits queued for the owner
    got.append(send(peers[0], 2, 2, U))  # as if this node owned it
    assert guber.eventually(peers[1], 2, **fields).remaining == 2  # waitForBroadcast
    got.append(send(peers[1], 0, 2, U))
    got.append(send(peers[0], 0, 2, U))
    got.append(send(peers[1], 2, 0, U))  # computed before forwarding to the owner
    assert guber.eventually(peers[0], 0, **fields).remaining == 0
    got.append(send(peers[0], 1, 0, OVER))
    assert {rl.limit for rl in got} == {5}
    assert len({rl.reset_time for rl in got}) == 1  # reset_time does not change
    assert all(rl.metadata["owner"] == guber.owner(name, key) for rl in got)


def test_TestGlobalRequestMoreThanAvailable_gubernator_mode(guber_compat: Guber) -> None:
    guber = guber_compat
    name, key = "TestGlobalRequestMoreThanAvailable", random_key()
    peers = guber.non_owners(name, key)
    fields = global_fields(name, key, algorithm=1, duration=1000 * MINUTE, limit=100)
    for peer in peers:
        assert guber.check(peer, hits=0, **fields).status == U
    for peer in peers:  # each spends the whole remaining it knows: Gubernator over-consumes
        assert guber.check(peer, hits=50, **fields).status == U
    assert guber.eventually(peers[0], 0, **fields).remaining == 0
    rl = guber.check(peers[0], hits=1, **fields)
    assert (rl.error, rl.status) == ("", OVER)


def test_TestGlobalNegativeHits_gubernator_mode(guber_compat: Guber) -> None:
    guber = guber_compat
    name, key = "TestGlobalNegativeHits", random_key()
    peers = guber.non_owners(name, key)
    fields = global_fields(name, key, algorithm=0, duration=100 * MINUTE, limit=2)
    send = _sender(guber, fields)
    send(peers[0], -1, 3, U)
    assert guber.eventually(peers[1], 3, **fields).remaining == 3
    send(peers[1], -1, 4, U)
    assert guber.eventually(peers[0], 4, **fields).remaining == 4
    send(peers[0], 4, 0, U)  # "should have 4 in the remainder"
    assert guber.eventually(peers[1], 0, **fields).remaining == 0
    send(peers[1], 0, 0, U)


def test_TestGlobalResetRemaining_gubernator_mode(guber_compat: Guber) -> None:
    guber = guber_compat
    name, key = "TestGlobalResetRemaining", random_key()
    peers = guber.non_owners(name, key)
    fields = global_fields(name, key, algorithm=1, duration=1000 * MINUTE, limit=100)
    send = _sender(guber, fields)
    for peer in peers:  # each from its own fresh bucket
        send(peer, 50, 50, U)
    assert guber.eventually(peers[0], 0, **fields).remaining == 0
    send(peers[0], 1, 0, OVER)
    reset = {**fields, "behavior": 2 | 8}  # GLOBAL | RESET_REMAINING, through the owner
    rl = guber.check(peers[0], hits=0, **reset)
    assert (rl.error, rl.remaining) == ("", 100)
    assert guber.eventually(peers[1], 100, **fields).remaining == 100


# -- interval_test.go: calendar windows, through a token bucket's reset_time ---------------


def ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> int:
    """Epoch ms of a UTC date, as upstream's clock.Date(..., clock.UTC)."""
    return int(datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp() * 1000)


@pytest.mark.parametrize(
    ("test", "now", "unit", "upstream"),
    [
        (
            "TestGregorianExpirationMinute",
            ms(2019, 11, 11),
            GREGORIAN_MINUTES,
            ms(2019, 11, 11, 0, 0, 59) + 999,
        ),
        (
            "TestGregorianExpirationMinute",
            ms(2019, 11, 11, 0, 0, 30),
            GREGORIAN_MINUTES,
            1573430459999,
        ),
        (
            "TestGregorianExpirationHour",
            ms(2019, 11, 11),
            GREGORIAN_HOURS,
            ms(2019, 11, 11, 0, 59, 59) + 999,
        ),
        ("TestGregorianExpirationHour", ms(2019, 11, 11, 0, 20, 1), GREGORIAN_HOURS, 1573433999999),
        (
            "TestGregorianExpirationDay",
            ms(2019, 11, 11),
            GREGORIAN_DAYS,
            ms(2019, 11, 11, 23, 59, 59) + 999,
        ),
        ("TestGregorianExpirationDay", ms(2019, 11, 11, 12, 10, 9), GREGORIAN_DAYS, 1573516799999),
        (
            "TestGregorianExpirationMonth",
            ms(2019, 11, 1),
            GREGORIAN_MONTHS,
            ms(2019, 11, 30, 23, 59, 59) + 999,
        ),
        (
            "TestGregorianExpirationMonth",
            ms(2019, 11, 11, 22, 2, 23),
            GREGORIAN_MONTHS,
            1575158399999,
        ),
        (
            "TestGregorianExpirationMonth",
            ms(2019, 1, 1),
            GREGORIAN_MONTHS,
            ms(2019, 1, 31, 23, 59, 59) + 999,
        ),
        (
            "TestGregorianExpirationYear",
            ms(2019, 1, 1),
            GREGORIAN_YEARS,
            ms(2019, 12, 31, 23, 59, 59) + 999,
        ),
        ("TestGregorianExpirationYear", ms(2019, 3, 1, 20, 50, 31), GREGORIAN_YEARS, 1577836799999),
    ],
)
def test_TestGregorianExpiration(
    guber: Guber, test: str, now: int, unit: int, upstream: int
) -> None:
    """Upstream's GregorianExpiration is the last millisecond of the calendar interval
    (UTC in its tests); smockron's windows are half-open, so its reset_time is the first
    millisecond of the next interval: one more (docs/algorithms.md, difference 5)."""
    rl = guber.check(
        random.choice(guber.addresses),
        name=test,
        unique_key=random_key(),
        hits=1,
        limit=10,
        duration=unit,
        behavior=4,
        created_at=now,
    )
    assert (rl.error, rl.status, rl.remaining) == ("", U, 9)
    assert rl.reset_time == upstream + 1


def test_TestGregorianExpirationInvalid(guber: Guber) -> None:
    rl = guber.check(
        guber.addresses[0],
        name="TestGregorianExpirationInvalid",
        unique_key=random_key(),
        hits=1,
        limit=10,
        duration=99,
        behavior=4,
        created_at=ms(2019, 1, 1),
    )
    assert rl.error.startswith(
        "behavior DURATION_IS_GREGORIAN is set; but `Duration` is not a valid gregorian interval"
    )


# -- daemon.go: the start-up lines operators wait for --------------------------------------


def test_startup_log_lines_use_gubernators_words(guber: Guber) -> None:
    for address, port, proc in zip(
        guber.addresses, guber.cluster.http_ports, guber.cluster.procs, strict=True
    ):
        log = proc.log()
        assert f"GRPC Listening on {address} ..." in log
        assert f"HTTP Gateway Listening on 127.0.0.1:{port} ..." in log
