"""Nodes that join and leave through etcd reshape every node's ring without a restart."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc

from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc
from smockron.core.hashring import HashRing
from tests.support import EtcdServer, Proc, free_ports, run_smockron, stopping, wait_port


def start_node(tmp: Path, etcd: EtcdServer, name: str) -> tuple[Proc, str]:
    g, h = free_ports(2)
    address = f"127.0.0.1:{g}"
    args = [
        "cluster",
        "--grpc-address",
        address,
        "--http-address",
        f"127.0.0.1:{h}",
        "--peer-discovery",
        "etcd",
        "--etcd-endpoints",
        etcd.endpoint,
    ]
    proc = run_smockron(args, tmp / f"{name}.log")
    wait_port(g, 20)
    return proc, address


async def call(address: str, method: str, msg: Any) -> Any:
    async with grpc.aio.insecure_channel(address) as channel:
        stub: Any = gubernator_pb2_grpc.V1Stub(channel)  # type: ignore[no-untyped-call]
        return await getattr(stub, method)(msg, timeout=5)


async def wait_peer_count(address: str, count: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    seen = -1
    while time.monotonic() < deadline:
        seen = (await call(address, "HealthCheck", pb.HealthCheckReq())).peer_count
        if seen == count:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{address} sees {seen} peers, expected {count}")


async def owner_via(address: str, key: str) -> str:
    msg = pb.GetRateLimitsReq(
        requests=[pb.RateLimitReq(name="m", unique_key=key, hits=1, limit=100, duration=60_000)]
    )
    resp = await call(address, "GetRateLimits", msg)
    assert resp.responses[0].error == ""
    return str(resp.responses[0].metadata["owner"])


async def test_join_and_leave_via_etcd(tmp_path: Path, etcd_server: EtcdServer) -> None:
    procs: list[Proc] = []
    with stopping(procs):
        a, addr_a = start_node(tmp_path, etcd_server, "a")
        procs.append(a)
        b, addr_b = start_node(tmp_path, etcd_server, "b")
        procs.append(b)
        await wait_peer_count(addr_a, 2)
        await wait_peer_count(addr_b, 2)
        c, addr_c = start_node(tmp_path, etcd_server, "c")
        procs.append(c)
        await wait_peer_count(addr_a, 3)
        ring = HashRing([addr_a, addr_b, addr_c])
        key = next(k for k in (f"j{i}" for i in range(1000)) if ring.owner(f"m_{k}") == addr_c)
        assert await owner_via(addr_a, key) == addr_c
        c.stop()  # SIGTERM: withdraws its etcd registration
        await wait_peer_count(addr_a, 2)
        assert await owner_via(addr_a, key) in {addr_a, addr_b}
        assert await owner_via(addr_b, key) == await owner_via(addr_a, key)
