"""The Envoy front through real gRPC on loopback: latency and throughput.

Run: python bench/envoy.py. One grpc.aio server (LocalLimiter behind it) and one client
in the same process and event loop (so the client's cost is included). Prints the
median of 3 runs of: sequential ShouldRateLimit calls (p50/p99 latency, calls/s) and
64 concurrent callers (calls/s), one descriptor per call; plus 10 descriptors per call.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import grpc

from smockron.cluster.envoy import add_to_server, parse_domain
from smockron.cluster.envoy.config import EnvoyConfig
from smockron.cluster.envoy.pb import ratelimit_pb2, rls_pb2, rls_pb2_grpc
from smockron.cluster.local import LocalLimiter

CONFIG = {
    "domain": "bench",
    "descriptors": [
        {"key": "user", "rate_limit": {"unit": "second", "requests_per_unit": 1_000_000}}
    ],
}
SEQUENTIAL, CONCURRENT, WORKERS, RUNS = 2_000, 4_000, 64, 3


def request(i: int, descriptors: int = 1) -> rls_pb2.RateLimitRequest:
    descs = []
    for j in range(descriptors):
        d = ratelimit_pb2.RateLimitDescriptor()
        d.entries.add(key="user", value=f"u{(i + j) % 1000}")
        descs.append(d)
    return rls_pb2.RateLimitRequest(domain="bench", descriptors=descs)


async def sequential(stub: rls_pb2_grpc.RateLimitServiceStub) -> tuple[float, float, float]:
    latencies = []
    start = time.perf_counter()
    for i in range(SEQUENTIAL):
        t = time.perf_counter()
        await stub.ShouldRateLimit(request(i), timeout=5)
        latencies.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - start
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1e3
    p99 = latencies[int(len(latencies) * 0.99)] * 1e3
    return p50, p99, SEQUENTIAL / elapsed


async def concurrent(stub: rls_pb2_grpc.RateLimitServiceStub, descriptors: int) -> float:
    counter = iter(range(CONCURRENT))

    async def worker() -> None:
        for i in counter:
            await stub.ShouldRateLimit(request(i, descriptors), timeout=5)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(WORKERS)))
    return CONCURRENT / (time.perf_counter() - start)


async def main() -> None:
    domain, root = parse_domain(CONFIG)
    server = grpc.aio.server()
    add_to_server(server, LocalLimiter(), EnvoyConfig({domain: root}))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)  # type: ignore[no-untyped-call]
    try:
        await sequential(stub)  # warm up
        seq = [await sequential(stub) for _ in range(RUNS)]
        one = [await concurrent(stub, 1) for _ in range(RUNS)]
        ten = [await concurrent(stub, 10) for _ in range(RUNS)]
    finally:
        await channel.close(None)
        await server.stop(None)
    print(f"median of {RUNS} runs; client and server share one process and loop")
    print(
        f"sequential, 1 descriptor: p50 {statistics.median(s[0] for s in seq):.3f} ms, "
        f"p99 {statistics.median(s[1] for s in seq):.3f} ms, "
        f"{statistics.median(s[2] for s in seq):,.0f} calls/s"
    )
    print(f"{WORKERS} concurrent, 1 descriptor: {statistics.median(one):,.0f} calls/s")
    ten_calls = statistics.median(ten)
    print(
        f"{WORKERS} concurrent, 10 descriptors: {ten_calls:,.0f} calls/s "
        f"= {ten_calls * 10:,.0f} descriptor checks/s"
    )


if __name__ == "__main__":
    asyncio.run(main())
