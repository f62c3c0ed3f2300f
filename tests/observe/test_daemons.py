"""``/healthz``, ``/readyz`` and ``/metrics`` on real processes of all six commands."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.gatekeeper.backend import backend
from tests.gatekeeper.commands import proxy_args
from tests.master.client import FakeGatekeeper
from tests.observe.endpoints import assert_probes, get, readyz, sample, samples, wait_ready
from tests.support import (
    Proc,
    RedisServer,
    cluster_args,
    free_ports,
    master_args,
    router_args,
    run_smockron,
    smockron_proc,
    stopping,
    wait_for,
    wait_port,
)


@pytest.fixture(scope="module", autouse=True)
def lost_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, int]]:
    """A proxy whose master address is wrong, started early: its grace runs meanwhile."""
    listen, met, nobody_acc, nobody_ctl = free_ports(4)
    args = [
        "proxy",
        "--listen",
        f"127.0.0.1:{listen}",
        "--upstream",
        "http://127.0.0.1:1",
        "--domain",
        "api",
        "--accounting",
        f"tcp://127.0.0.1:{nobody_acc}",
        "--control",
        f"tcp://127.0.0.1:{nobody_ctl}",
        "--metrics",
        f"127.0.0.1:{met}",
    ]
    proc = run_smockron(args, tmp_path_factory.mktemp("lost") / "proxy.log")
    with stopping([proc]):
        yield proc, met


def test_master(tmp_path: Path) -> None:
    acc, ctl, met = free_ports(3)
    args = master_args(acc, ctl, rules=["api:1/s:2", "probe:1/s:1"], metrics=met)
    with smockron_proc(args, tmp_path / "master.log"), FakeGatekeeper(acc, ctl) as gk:
        wait_port(met)
        gk.handshake()
        assert_probes(met)
        for _ in range(5):
            gk.accepted("api", b"alice")
        wait_for(
            lambda: (
                (
                    sample(met, "smockron_master_messages_total", domain="api", status="accepted")
                    or 0
                )
                >= 5
            )
        )
        assert (sample(met, "smockron_master_delay_until_published_total", domain="api") or 0) > 0
        status, body = get(met, "/stats")
        stats = json.loads(body)
        assert status == 200 and stats["domains"]["api"]["accepted"] == 5
        assert stats["top"]["api"][0][0] == "alice"


def test_master_with_unreachable_redis_is_not_ready_and_warns(tmp_path: Path) -> None:
    acc, ctl, met, redis_port = free_ports(4)
    store = f"redis://127.0.0.1:{redis_port}/0"  # nothing listens there yet
    args = master_args(acc, ctl, "--store", store, rules=["api:1/s:2"], metrics=met)
    with smockron_proc(args, tmp_path / "master.log") as proc:
        wait_port(met)
        assert get(met, "/healthz") == (200, b"ok\n")  # alive, just not ready
        wait_for(lambda: "unreachable" in proc.log(), 10, 0.1)
        status, body = readyz(met)
        assert status == 503 and "unreachable" in body["failing"]["store"], body
        assert "WARNING" in proc.log() and store in proc.log()
        redis = RedisServer(redis_port, tmp_path)
        redis.start()
        try:
            wait_ready(met, 10)  # the store answers again: ready
        finally:
            redis.stop()


def test_router(tmp_path: Path) -> None:
    acc, ctl, met, m_acc, m_ctl = free_ports(5)
    args = router_args(acc, ctl, (m_acc, m_ctl), metrics=met)
    with smockron_proc(args, tmp_path / "router.log"), FakeGatekeeper(acc, ctl) as gk:
        wait_port(met)
        assert_probes(met)

        def forwarded() -> bool:
            gk.accepted("api", b"x")
            gk.send([b"", b"ACCEPTED", b"x", b"1", b""])  # no domain: discarded
            return (sample(met, "smockron_router_discarded_total") or 0) > 0 and (
                sample(met, "smockron_router_forwarded_total") or 0
            ) > 0

        wait_for(forwarded, 10, 0.1)
        assert sample(met, "smockron_router_relayed_total") == 0


def test_proxy_with_its_master(tmp_path: Path) -> None:
    acc, ctl, m_met, listen, met = free_ports(5)
    procs: list[Proc] = []
    with backend() as (upstream, _seen), stopping(procs):
        procs.append(
            run_smockron(
                master_args(acc, ctl, rules=["api:1/s:3"], metrics=m_met), tmp_path / "master.log"
            )
        )
        procs.append(
            run_smockron(
                proxy_args(
                    listen,
                    upstream,
                    f"tcp://127.0.0.1:{acc}",
                    f"tcp://127.0.0.1:{ctl}",
                    "--metrics",
                    f"127.0.0.1:{met}",
                    max_delay="0s",
                    identify=None,
                ),
                tmp_path / "proxy.log",
            )
        )
        wait_port(listen)
        wait_ready(met)  # the control connection is up
        assert_probes(met)
        for _ in range(6):
            get(listen, "/x")
        accepted = sample(met, "smockron_gatekeeper_decisions_total", verdict="accepted")
        assert accepted is not None and accepted >= 3
        total = accepted + (
            sample(met, "smockron_gatekeeper_decisions_total", verdict="rejected") or 0
        )
        assert total == 6
        assert sample(met, "smockron_gatekeeper_control_connected") == 1
        assert sample(met, "smockron_gatekeeper_bad_requests_total") == 0
        with socket.create_connection(("127.0.0.1", listen), timeout=5) as s:
            s.sendall(b"\x16\x03\x01 not http\r\n\r\n")
            s.recv(1024)
        wait_for(lambda: sample(met, "smockron_gatekeeper_bad_requests_total") == 1, 5)


def test_jarl(tmp_path: Path) -> None:
    port, met = free_ports(2)
    args = [
        "jarl",
        "--service",
        "s",
        "--requests",
        "2",
        "--period",
        "60",
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--metrics",
        f"127.0.0.1:{met}",
    ]
    with smockron_proc(args, tmp_path / "jarl.log"):
        wait_port(met)
        assert_probes(met)
        answers = []
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                answers.append(s.recv(64))
        assert answers[:2] == [b"0.000", b"0.000"] and answers[2] != b"0.000"
        assert sample(met, "smockron_jarl_decisions_total", verdict="accepted") == 2
        assert sample(met, "smockron_jarl_decisions_total", verdict="delayed") == 1


def test_dthrottle(tmp_path: Path) -> None:
    port, met = free_ports(2)
    args = [
        "dthrottle",
        "--listen",
        f"tcp:127.0.0.1:{port}",
        "--burst",
        "2",
        "--rate",
        "0.01",
        "--metrics",
        f"127.0.0.1:{met}",
    ]
    with smockron_proc(args, tmp_path / "dthrottle.log"):
        wait_port(met)
        assert_probes(met)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"t\nt\nt\n")
            got = b""
            while got.count(b"\n") < 3:
                got += s.recv(64)
        assert got == b"OK\nOK\nNO\n"
        assert sample(met, "smockron_dthrottle_decisions_total", verdict="accepted") == 2
        assert sample(met, "smockron_dthrottle_decisions_total", verdict="refused") == 1
        # past the tag limit: malformed, and closed, maybe while we still send
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as s,
            contextlib.suppress(ConnectionResetError, BrokenPipeError),
        ):
            s.sendall(b"x" * 100_000 + b"\n")
            s.recv(64)
        wait_for(lambda: sample(met, "smockron_dthrottle_overlong_total") == 1, 5)


def _post(port: int, body: Mapping[str, object]) -> dict[str, object]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/GetRateLimits", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        answer: dict[str, object] = json.loads(resp.read())
    return answer


def test_cluster(tmp_path: Path) -> None:
    g, h, m = free_ports(3)
    args = cluster_args(g, h, "--metrics", f"127.0.0.1:{m}", peers=[g])
    with smockron_proc(args, tmp_path / "node.log"):
        for port in (h, m):
            wait_port(port, 20)
        for port in (h, m):  # the gateway and the --metrics listener agree
            assert_probes(port)
        req = {
            "requests": [{"name": "n", "unique_key": "k", "hits": 1, "limit": 5, "duration": 60000}]
        }
        for _ in range(3):
            _post(h, req)
        checks = sum(
            v for (name, _), v in samples(m).items() if name == "smockron_cluster_checks_total"
        )
        assert checks >= 3


async def test_cluster_node_outside_its_ring_is_not_ready() -> None:
    from aiohttp import web

    from smockron.cluster.config import ClusterConfig
    from smockron.cluster.discovery.base import PeerInfo
    from smockron.cluster.node import Node
    from smockron.cluster.transports.http import make_app

    node = Node(ClusterConfig(grpc_address="127.0.0.1:9990"))
    runner = web.AppRunner(make_app(node))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        assert (await asyncio.to_thread(readyz, port))[0] == 200
        node.set_peers([PeerInfo("127.0.0.1:9991")])  # discovery lists others, not us
        status, body = await asyncio.to_thread(readyz, port)
        assert status == 503 and "not in the ring" in body["failing"]["ring"], body
        assert await asyncio.to_thread(get, port, "/healthz") == (200, b"ok\n")
    finally:
        await runner.cleanup()
        await node.close()


def test_proxy_with_a_wrong_master_address_is_not_ready_and_warns(
    lost_proxy: tuple[Proc, int],
) -> None:
    proc, met = lost_proxy
    wait_port(met)
    assert get(met, "/healthz") == (200, b"ok\n")
    status, body = readyz(met)
    assert status == 503 and "no control connection" in body["failing"]["master"], body
    deadline = time.monotonic() + 15
    while "WARNING" not in proc.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    warnings = [line for line in proc.log().splitlines() if "WARNING" in line]
    assert len(warnings) == 1, proc.log()  # one loud line, not one per second
    assert "no control connection to the master at tcp://127.0.0.1:" in warnings[0]
    assert sample(met, "smockron_gatekeeper_control_connected") == 0
