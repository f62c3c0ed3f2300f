"""What the Python client costs on top of the generated gRPC stub.

Run: python bench/client.py [--seconds 1] [--runs 3]. Starts one real ``smockron cluster``
node on loopback and measures, one call in flight, each as the median of ``--runs``:

* single checks/s: ``Client.check`` vs the raw sync stub with a prebuilt message, and
  ``AsyncClient.check`` vs the raw grpc.aio stub (the baselines, measured in the same run);
* checks/s with 1,000 checks per call: ``get_rate_limits`` (model -> protobuf conversion
  included) vs the raw stub sending one prebuilt 1,000-item message.

The ratio is client / raw: 1.00 means the client adds nothing measurable.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from smockron.cluster.client import MINUTE, AsyncClient, Client
from smockron.cluster.model import RateLimitRequest
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc
from tests.support import free_ports, run_smockron, wait_port

pb_grpc: Any = gubernator_pb2_grpc
BATCH = 1000


def rate(fn: Callable[[], int], seconds: float) -> float:
    """Checks per second of calling ``fn`` (which returns checks done) for ``seconds``."""
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        done += fn()
    return done / elapsed


async def arate(fn: Callable[[], Awaitable[int]], seconds: float) -> float:
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        done += await fn()
    return done / elapsed


def requests(n: int) -> list[RateLimitRequest]:
    # a huge limit so nothing is ever over: every call does the same work
    return [RateLimitRequest("bench", f"k{i}", 1, 10**12, MINUTE) for i in range(n)]


def pb_batch(n: int) -> pb.GetRateLimitsReq:
    return pb.GetRateLimitsReq(
        requests=[pb.RateLimitReq(name="bench", unique_key=f"k{i}", hits=1, limit=10**12,
                                  duration=MINUTE) for i in range(n)]
    )  # fmt: skip


def sync_rates(address: str, seconds: float) -> dict[str, float]:
    one, many = pb_batch(1), pb_batch(BATCH)
    reqs = requests(BATCH)
    with grpc.insecure_channel(address) as channel, Client(address) as client:
        stub = pb_grpc.V1Stub(channel)

        def raw_one() -> int:
            stub.GetRateLimits(one, timeout=5)
            return 1

        def client_one() -> int:
            client.check("bench", "k0", 1, 10**12, MINUTE)
            return 1

        def raw_many() -> int:
            stub.GetRateLimits(many, timeout=5)
            return BATCH

        def client_many() -> int:
            client.get_rate_limits(reqs)
            return BATCH

        return {
            "sync single: raw stub": rate(raw_one, seconds),
            "sync single: Client.check": rate(client_one, seconds),
            "sync 1000/call: raw stub": rate(raw_many, seconds),
            "sync 1000/call: Client.get_rate_limits": rate(client_many, seconds),
        }


async def async_rates(address: str, seconds: float) -> dict[str, float]:
    one = pb_batch(1)
    async with grpc.aio.insecure_channel(address) as channel, AsyncClient(address) as client:
        stub = pb_grpc.V1Stub(channel)

        async def raw_one() -> int:
            await stub.GetRateLimits(one, timeout=5)
            return 1

        async def client_one() -> int:
            await client.check("bench", "k0", 1, 10**12, MINUTE)
            return 1

        return {
            "async single: raw grpc.aio stub": await arate(raw_one, seconds),
            "async single: AsyncClient.check": await arate(client_one, seconds),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    grpc_port, http_port = free_ports(2)
    address = f"127.0.0.1:{grpc_port}"
    with tempfile.TemporaryDirectory() as tmp:
        proc = run_smockron(
            ["cluster", "--grpc-address", address, "--http-address", f"127.0.0.1:{http_port}"],
            Path(tmp) / "node.log",
        )
        try:
            wait_port(grpc_port, 20)
            runs: dict[str, list[float]] = {}
            for _ in range(args.runs):
                found = sync_rates(address, args.seconds)
                found |= asyncio.run(async_rates(address, args.seconds))
                for name, value in found.items():
                    runs.setdefault(name, []).append(value)
        finally:
            proc.stop()

    medians = {name: statistics.median(values) for name, values in runs.items()}
    print(f"median of {args.runs} runs x {args.seconds:.1f}s, one call in flight")
    for name, value in medians.items():
        print(f"  {name:45s} {value:>10,.0f} checks/s")
    pairs = [
        ("sync single", "sync single: Client.check", "sync single: raw stub"),
        ("async single", "async single: AsyncClient.check", "async single: raw grpc.aio stub"),
        ("sync 1000/call", "sync 1000/call: Client.get_rate_limits", "sync 1000/call: raw stub"),
    ]
    for label, mine, raw in pairs:
        print(f"  ratio client/raw, {label:20s} {medians[mine] / medians[raw]:.2f}")


if __name__ == "__main__":
    main()
