"""Gubernator's metric names on a real node's /metrics: a dashboard built on Gubernator
keeps its series (names, types and labels as gubernator's Go source declares them)."""

from __future__ import annotations

import contextlib
import json
import math
import re
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from smockron.cluster.metrics import ClusterMetrics, gubernator_exposition
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc
from tests.support import (
    Proc,
    cluster_args,
    cluster_nodes,
    free_ports,
    run_smockron,
    stopping,
    wait_for,
    wait_port,
)

V1 = "/pb.gubernator.V1/GetRateLimits"
TYPES = {
    "gubernator_getratelimit_counter": "counter",
    "gubernator_grpc_request_counts": "counter",
    "gubernator_grpc_request_duration": "summary",
    "gubernator_global_send_duration": "summary",
    "gubernator_global_send_errors": "counter",
    "gubernator_broadcast_duration": "summary",
    "gubernator_broadcast_errors": "counter",
    "gubernator_cache_size": "gauge",
    "gubernator_updatepeerglobals_counter": "counter",
}
SAMPLE = re.compile(r"^([a-z_]+)(?:\{(.*)\})? (\S+)$")


def scrape(http_port: int) -> tuple[dict[str, str], dict[tuple[str, str], float]]:
    """The TYPE of each family, and each sample by (name, labels text)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    samples = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and match.group(1).startswith("gubernator_"):
            samples[(match.group(1), match.group(2) or "")] = float(match.group(3))
    return types, samples


def check(http_port: int, key: str, behavior: int = 0) -> None:
    item = {
        "name": "dash",
        "unique_key": key,
        "hits": 1,
        "limit": 100,
        "duration": 60_000,
        "behavior": behavior,
    }
    body = json.dumps({"requests": [item]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{http_port}/v1/GetRateLimits", body)
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert json.loads(resp.read())["responses"][0].get("error", "") == ""


@contextlib.contextmanager
def two_nodes(tmp_path: Path, sync_wait: str) -> Iterator[tuple[int, int, int, int]]:
    """Two ``smockron cluster`` processes peered by ``--peers``, serving HTTP, with
    ``--global-sync-wait``: their gRPC and HTTP ports (g1, h1, g2, h2)."""
    with cluster_nodes(tmp_path, "--global-sync-wait", sync_wait, nodes=2) as (a, b):
        yield a.grpc_port, a.http_port, b.grpc_port, b.http_port


def test_a_real_node_exports_gubernators_names(tmp_path: Path) -> None:
    with two_nodes(tmp_path, "20ms") as (_g1, h1, _g2, h2):
        for i in range(3):  # plain checks, each decided at its key's owner
            check(h1, f"local-{i}")
        for i in range(20):  # GLOBAL keys, some owned by each node: the second check at
            check(h1, f"global-{i % 10}", behavior=2)  # a non-owner is answered there

        def synced() -> bool:
            ones, twos = scrape(h1)[1], scrape(h2)[1]
            sent = ones[("gubernator_global_send_duration_count", "")] > 0  # h1's hits
            return sent and all(
                s[("gubernator_broadcast_duration_count", "")] > 0 for s in (ones, twos)
            )

        wait_for(synced)
        types, samples = scrape(h1)
        other = scrape(h2)[1]
    assert {name: types.get(name) for name in TYPES} == TYPES
    calls = samples[("gubernator_grpc_request_counts", f'method="{V1}",status="success"')]
    assert calls == 23
    assert samples[("gubernator_grpc_request_duration_count", f'method="{V1}"')] == 23
    assert samples[("gubernator_grpc_request_duration_sum", f'method="{V1}"')] > 0
    median = samples[("gubernator_grpc_request_duration", f'method="{V1}",quantile="0.5"')]
    assert 0 < median < samples[("gubernator_grpc_request_duration_sum", f'method="{V1}"')]
    # a check decided by an owner counts "local" there: the 3, and at least the first
    # check of each GLOBAL key (the second may be a replica's: "global" at the non-owner)
    local = [s[("gubernator_getratelimit_counter", 'calltype="local"')] for s in (samples, other)]
    assert sum(local) >= 3 + 10
    assert samples[("gubernator_getratelimit_counter", 'calltype="global"')] > 0
    assert samples[("gubernator_global_send_duration_count", "")] > 0
    assert samples[("gubernator_global_send_errors", "")] == 0
    assert sum(s[("gubernator_cache_size", "")] for s in (samples, other)) >= 3 + 10
    received = [s[("gubernator_updatepeerglobals_counter", "")] for s in (samples, other)]
    assert min(received) > 0  # each node owns some GLOBAL keys and broadcast them


def test_quantiles_come_from_the_buckets() -> None:
    metrics = ClusterMetrics()
    text = gubernator_exposition(metrics, 0).decode()
    assert f'gubernator_grpc_request_duration{{method="{V1}",quantile="0.5"}} NaN' in text
    for seconds in (0.0002,) * 50 + (0.02,) * 50:
        metrics.client_duration.observe(seconds)
    text = gubernator_exposition(metrics, 7).decode()
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    # rank 50 of 100 ends the (0.0001, 0.00025] bucket; rank 99 is inside (0.01, 0.025]
    assert float(values[f'gubernator_grpc_request_duration{{method="{V1}",quantile="0.5"}}']) == (
        0.00025
    )
    q99 = float(values[f'gubernator_grpc_request_duration{{method="{V1}",quantile="0.99"}}'])
    assert math.isclose(q99, 0.01 + 0.015 * 49 / 50)
    assert values["gubernator_cache_size"] == "7"
    assert values['gubernator_getratelimit_counter{calltype="local"}'] == "0"


def post(http_port: int, items: list[dict[str, object]]) -> tuple[int, list[dict[str, str]]]:
    body = json.dumps({"requests": items}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{http_port}/v1/GetRateLimits", body)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())["responses"]
    except urllib.error.HTTPError as exc:
        return exc.code, []


def item(key: str, limit: int = 1, **more: object) -> dict[str, object]:
    return {
        "name": "dash",
        "unique_key": key,
        "hits": 1,
        "limit": limit,
        "duration": 60_000,
        **more,
    }


@pytest.mark.parametrize("path", ["compiled", "python"])
def test_checks_move_the_limiter_and_error_counters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Over-limit checks, cache hits and misses, evictions of live keys, refused items and
    calls, on a real node with room for two keys (the C check and the Python one)."""
    monkeypatch.setenv("SMOCKRON_PURE_PYTHON", "1" if path == "python" else "0")
    g, h = free_ports(2)
    args = cluster_args(g, h, "--cache-size", "2", peers=[g])
    procs: list[Proc] = []
    with stopping(procs):
        procs.append(run_smockron(args, tmp_path / "node.log"))
        wait_port(h)
        types, before = scrape(h)
        statuses = [
            post(h, [item("over")])[1][0].get("status", "UNDER_LIMIT"),
            post(h, [item("over")])[1][0].get("status", "UNDER_LIMIT"),
        ]
        for key in ("k1", "k2", "k3"):  # each evicts the least recently used, still live
            post(h, [item(key, limit=5)])
        _, bad = post(h, [item(""), item("algo", algorithm=9), item("k3", limit=5)])
        too_many = post(h, [item(f"m{i}") for i in range(1001)])[0]
        with grpc.insecure_channel(f"127.0.0.1:{g}") as channel:  # the native server
            stub = gubernator_pb2_grpc.V1Stub(channel)  # type: ignore[no-untyped-call]
            msg = pb.RateLimitReq(name="dash", unique_key="g", hits=1, limit=5, duration=60_000)
            odd = pb.RateLimitReq(name="dash", unique_key="g", algorithm=9)  # type: ignore[arg-type]  # unknown on purpose
            grpc_bad = stub.GetRateLimits(pb.GetRateLimitsReq(requests=[odd]), timeout=5)
            with pytest.raises(grpc.RpcError) as refused:
                stub.GetRateLimits(pb.GetRateLimitsReq(requests=[msg] * 1001), timeout=5)
        _, after = scrape(h)
    assert statuses == ["UNDER_LIMIT", "OVER_LIMIT"]
    assert [bool(r.get("error")) for r in bad] == [True, True, False]
    assert too_many == 400
    assert grpc_bad.responses[0].error
    assert refused.value.code() == grpc.StatusCode.OUT_OF_RANGE
    for name, kind in {
        "gubernator_over_limit_counter": "counter",
        "gubernator_check_error_counter": "counter",
        "gubernator_cache_access_count": "counter",
        "gubernator_unexpired_evictions_count": "counter",
        "gubernator_func_duration": "summary",
        "gubernator_concurrent_checks_counter": "gauge",
    }.items():
        assert types.get(name) == kind, name

    def moved(name: str, labels: str = "") -> float:
        return after[(name, labels)] - before[(name, labels)]

    assert moved("gubernator_over_limit_counter") == 1
    # "over" misses then hits; k1..k3 miss; the last k3 hits
    assert moved("gubernator_cache_access_count", 'type="hit"') == 2
    assert moved("gubernator_cache_access_count", 'type="miss"') == 4
    assert moved("gubernator_unexpired_evictions_count") == 2  # "over", then k1
    errors = "gubernator_check_error_counter"
    assert moved(errors, 'error="Invalid request"') == 1
    assert moved(errors, 'error="Invalid algorithm"') == 2  # HTTP, gRPC
    assert moved(errors, 'error="Request too large"') == 2
    func = 'name="V1Instance.GetRateLimits"'
    assert moved("gubernator_func_duration_count", func) == 7  # the calls answered
    assert after[("gubernator_func_duration", func + ',quantile="1"')] > 0
    assert after[("gubernator_concurrent_checks_counter", "")] == 0


def test_queue_lengths_follow_the_global_rounds(tmp_path: Path) -> None:
    """GLOBAL hits wait at a non-owner for the next round (here 3 s): the send queue
    holds their keys until then, and every peer has its batch queue series."""
    with two_nodes(tmp_path, "3s") as (_g1, h1, g2, _h2):
        for i in range(20):
            check(h1, f"global-{i % 10}", behavior=2)
        types, waiting = scrape(h1)

        def drained() -> bool:
            samples = scrape(h1)[1]
            return samples[("gubernator_global_send_queue_length", "")] == 0

        wait_for(drained, timeout=15)
        after = scrape(h1)[1]
    for name in (
        "gubernator_global_send_queue_length",
        "gubernator_global_queue_length",
        "gubernator_batch_queue_length",
    ):
        assert types.get(name) == "gauge", name
    assert waiting[("gubernator_global_send_queue_length", "")] > 0
    assert after[("gubernator_global_send_queue_length", "")] == 0
    assert after[("gubernator_batch_queue_length", f'peerAddr="127.0.0.1:{g2}"')] == 0


def test_concurrent_checks_counts_calls_in_flight(tmp_path: Path) -> None:
    """A call forwarded to a peer that accepts connections and never answers stays in
    flight until the peer timeout (3 s): the gauge counts it meanwhile, and not after."""
    g, h, silent_port = free_ports(3)
    silent = socket.socket()
    silent.bind(("127.0.0.1", silent_port))
    silent.listen(16)  # accepts (in the kernel's backlog), never speaks HTTP/2
    args = cluster_args(
        g, h, "--peers-on-grpc-port", "--batch-timeout", "3s", peers=[g, silent_port]
    )
    procs: list[Proc] = []
    try:
        with stopping(procs):
            procs.append(run_smockron(args, tmp_path / "node.log"))
            wait_port(h)
            # twenty keys: some are the silent peer's (the chance that none is: 2**-20)
            call = threading.Thread(target=post, args=(h, [item(f"k{i}") for i in range(20)]))
            call.start()

            def in_flight() -> bool:
                return scrape(h)[1][("gubernator_concurrent_checks_counter", "")] == 1

            wait_for(in_flight, timeout=3)
            call.join(timeout=15)
            after = scrape(h)[1]
    finally:
        silent.close()
    assert not call.is_alive()
    assert after[("gubernator_concurrent_checks_counter", "")] == 0
