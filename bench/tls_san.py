"""What GRPC_CLIENT_TLS_SAN costs a node: server CPU per call, with and without the check.

Run: python bench/tls_san.py [--calls 2000] [--runs 3]. For each gRPC server kind, starts a
real ``smockron cluster`` node on loopback with TLS and required client certificates
(envoyproxy/ratelimit's variables), once without and once with GRPC_CLIENT_TLS_SAN, and
sends it ``--calls`` sequential single-check GetRateLimits calls on one channel whose
certificate carries the name. Prints, per server, the medians of ``--runs`` runs of the
node's CPU per call (/proc/PID/stat) and calls/s, and the with/without ratio measured in
the same run. The ``native`` server checks once per connection (in the handshake), the
``threads`` and ``asyncio`` servers on every call.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from _common import cpu_seconds, daemon, free_port, median

from smockron.cluster import tlsgen
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc
from smockron.cluster.transports import native

SERVERS = ["threads", "asyncio", *(["native"] if native.AVAILABLE else [])]


def make_certs(d: Path) -> grpc.ChannelCredentials:
    ca, ca_key = tlsgen.make_ca()
    client_ca, client_ca_key = tlsgen.make_ca("client")
    cert, key = tlsgen.make_cert(ca, ca_key, ["localhost", "127.0.0.1"])
    client, client_key = tlsgen.make_cert(client_ca, client_ca_key, ["envoy.internal"])
    for name, data in {"server.pem": cert, "server.key": key, "client-ca.pem": client_ca}.items():
        (d / name).write_bytes(data)
    return grpc.ssl_channel_credentials(ca, client_key, client)


async def drive(address: str, creds: grpc.ChannelCredentials, calls: int) -> float:
    """Calls/s of ``calls`` sequential single checks (after a warm-up)."""
    req = pb.GetRateLimitsReq(
        requests=[pb.RateLimitReq(name="b", unique_key="k", hits=1, limit=10**9, duration=60_000)]
    )
    async with grpc.aio.secure_channel(address, creds) as channel:
        stub: Any = gubernator_pb2_grpc.V1Stub(channel)  # type: ignore[no-untyped-call]
        for _ in range(100):
            await stub.GetRateLimits(req, timeout=5)
        start = time.perf_counter()
        for _ in range(calls):
            await stub.GetRateLimits(req, timeout=5)
        return calls / (time.perf_counter() - start)


def run(
    server: str, san: bool, d: Path, creds: grpc.ChannelCredentials, calls: int
) -> tuple[float, float]:
    """(server CPU µs per call, calls/s) of one node."""
    port = free_port()
    os.environ.update(
        GRPC_SERVER_USE_TLS="true",
        GRPC_SERVER_TLS_CERT=str(d / "server.pem"),
        GRPC_SERVER_TLS_KEY=str(d / "server.key"),
        GRPC_CLIENT_TLS_CACERT=str(d / "client-ca.pem"),
    )
    if san:
        os.environ["GRPC_CLIENT_TLS_SAN"] = "envoy.internal"
    else:
        os.environ.pop("GRPC_CLIENT_TLS_SAN", None)
    args = [
        "cluster",
        "--grpc-address",
        f"127.0.0.1:{port}",
        "--http-address",
        "",
        "--grpc-server",
        server,
    ]
    with daemon(args, port) as proc:
        time.sleep(0.5)
        before = cpu_seconds(proc.pid)
        rate = asyncio.run(drive(f"localhost:{port}", creds, calls))
        used = cpu_seconds(proc.pid) - before
    return used / (calls + 100) * 1e6, rate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        creds = make_certs(d)
        print(f"{'server':8} {'san':4} {'cpu us/call':>12} {'calls/s':>9}  cpu ratio (san/none)")
        for server in SERVERS:
            results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
            ratios = []
            for i in range(opts.runs):
                order = (False, True) if i % 2 == 0 else (True, False)
                got = {san: run(server, san, d, creds, opts.calls) for san in order}
                for san, value in got.items():
                    results[san].append(value)
                ratios.append(got[True][0] / got[False][0])
            for san in (False, True):
                cpu = median([r[0] for r in results[san]])
                rate = median([r[1] for r in results[san]])
                ratio = f"  {median(ratios):.2f}" if san else ""
                print(f"{server:8} {'on' if san else 'off':4} {cpu:12.0f} {rate:9.0f}{ratio}")


if __name__ == "__main__":
    main()
