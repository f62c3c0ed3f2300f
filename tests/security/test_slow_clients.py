"""Idle and slowloris connections cannot starve ``smockron proxy`` or the cluster's HTTP
gateway: under a lowered descriptor limit, more slow connections than descriptors leave
well-behaved requests served; headers that never finish are cut after the header
timeout; both are counted and logged."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import httpx
import pytest

from smockron import httpguard
from smockron.cluster.config import ClusterConfig
from smockron.cluster.server import ClusterServer
from tests.cluster.servers import serving
from tests.gatekeeper.backend import backend
from tests.gatekeeper.commands import proxy_args
from tests.support import Proc, free_ports, wait_for, wait_port

NOFILE = 256
"""The daemon's descriptor limit: the slow connections below outnumber it."""
SLOW = 300

LIMITED = (
    "import resource, runpy, sys\n"
    f"resource.setrlimit(resource.RLIMIT_NOFILE, ({NOFILE}, {NOFILE}))\n"
    "sys.argv = ['smockron', *sys.argv[1:]]\n"
    "runpy.run_module('smockron', run_name='__main__')\n"
)


def limited(args: list[str], log: Path) -> Proc:
    """``smockron ARGS`` with RLIMIT_NOFILE lowered to NOFILE."""
    return Proc([sys.executable, "-c", LIMITED, *args], log)


@contextlib.contextmanager
def slow_connections(port: int, n: int) -> Iterator[list[socket.socket]]:
    """``n`` connections, half idle, half slowloris (headers begun, never finished)."""
    socks: list[socket.socket] = []
    try:
        for i in range(n):
            s = socket.socket()
            s.settimeout(5)
            with contextlib.suppress(OSError):  # refused or reset: the server's choice
                s.connect(("127.0.0.1", port))
                if i % 2:
                    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith((name + " ", name + "{"))
    )


@pytest.mark.slow
def test_proxy_serves_well_behaved_clients_past_slow_ones(tmp_path: Path) -> None:
    port, met, acc, ctl = free_ports(4)
    with backend() as (up, _seen):
        args = proxy_args(
            port,
            up,
            f"tcp://127.0.0.1:{acc}",
            f"tcp://127.0.0.1:{ctl}",
            "--header-timeout",
            "2s",
            "--metrics",
            f"127.0.0.1:{met}",
        )
        proc = limited(args, tmp_path / "proxy.log")
        try:
            wait_port(port)
            wait_port(met)
            with slow_connections(port, SLOW) as socks:
                # more slow connections than descriptors: a new client is still served
                with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
                    for i in range(20):
                        r = client.get("/", headers={"x-client": f"c{i}", "connection": "close"})
                        assert r.status_code == 200, r.text
                assert metric(met, "smockron_gatekeeper_connections_evicted_total") > 0
                # the slow ones still open are cut after the header timeout
                wait_for(lambda: metric(met, "smockron_gatekeeper_header_timeouts_total") > 0, 10)
                time.sleep(2.5)
                still = [i for i, s in enumerate(socks) if _open(s)]
                assert still == []
            log = proc.log()
            assert "closed the longest idle" in log
            assert "no complete request headers in 2 s" in log
            assert log.count("closed the longest idle") < 20  # rate-limited
            assert "out of system resource" not in log and "Too many open files" not in log
        finally:
            proc.stop()


def _open(sock: socket.socket) -> bool:
    """Whether the server still holds ``sock`` open (no EOF or reset within 0.1 s)."""
    sock.settimeout(0.1)
    try:
        return sock.recv(1) != b""
    except TimeoutError:
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_cluster_gateway_serves_well_behaved_clients_past_slow_ones(tmp_path: Path) -> None:
    grpc_port, http_port = free_ports(2)
    args = [
        "cluster",
        "--grpc-address",
        f"127.0.0.1:{grpc_port}",
        "--http-address",
        f"127.0.0.1:{http_port}",
    ]
    proc = limited(args, tmp_path / "cluster.log")
    try:
        wait_port(http_port, 30)
        with slow_connections(http_port, SLOW):
            for _ in range(20):
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{http_port}/v1/HealthCheck", timeout=5
                ) as resp:
                    assert resp.status == 200
            closed = metric(http_port, "smockron_cluster_http_connections_closed_total")
            assert closed > 0
        assert "closed the longest idle" in proc.log()
    finally:
        proc.stop()


@pytest.fixture
async def gateway(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ClusterServer]:
    monkeypatch.setattr(httpguard, "HEADER_TIMEOUT_S", 0.5)
    g, h = free_ports(2)
    config = ClusterConfig(grpc_address=f"127.0.0.1:{g}", http_address=f"127.0.0.1:{h}")
    async with serving(config) as server:
        yield server


async def test_gateway_cuts_headers_that_never_finish(gateway: ClusterServer) -> None:
    host, port = gateway.config.http_address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/GetRateLimits HTTP/1.1\r\nHost: x\r\n")
    for _ in range(4):  # a byte every 0.1 s: each would restart aiohttp's own idle clock
        await asyncio.sleep(0.1)
        writer.write(b"X")
    assert await asyncio.wait_for(reader.read(), 3) == b""  # closed by the server
    writer.close()
    registry = gateway.node.metrics.registry
    name = "smockron_cluster_http_connections_closed_total"
    assert registry.get_sample_value(name, {"reason": "header_timeouts"}) == 1
    # a request in progress is never cut, however long it takes past the header timeout
    async with aiohttp.ClientSession() as session:
        resp = await session.get(f"http://{gateway.config.http_address}/v1/HealthCheck")
        assert resp.status == 200
        await asyncio.sleep(1.0)  # the kept-alive connection's idle time is longer
        again = await session.get(f"http://{gateway.config.http_address}/v1/HealthCheck")
        assert again.status == 200
    assert registry.get_sample_value(name, {"reason": "header_timeouts"}) == 1
