"""Expired keys reclaimed by a cluster node without traffic: a node's LocalLimiter filled
with ``--keys`` keys (through its checks), its clock moved past their expiry, then the
node's expiry sweep left to run (no check arrives). Reports RSS at baseline, full and
after the sweep, how long the sweep took and how long each step held the cache lock.

In one process (the limiter and node are the real ones; the clock is injected so the
wave expires at once). Run: python bench/cluster_reclaim.py [--keys 1000000] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from smockron.cluster.config import ClusterConfig  # noqa: E402
from smockron.cluster.local import LocalLimiter  # noqa: E402
from smockron.cluster.model import RateLimitRequest  # noqa: E402
from smockron.cluster.node import Node  # noqa: E402


def rss_mb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    return 0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


async def run(keys: int) -> dict[str, Any]:
    base = rss_mb()
    clock = Clock()
    limiter = LocalLimiter(clock, max_keys=keys)
    for start in range(0, keys, 1000):
        limiter.check(
            [
                RateLimitRequest("n", f"key{i}", 1, 5, 1000)
                for i in range(start, min(keys, start + 1000))
            ]
        )
    full = rss_mb()
    node = Node(ClusterConfig(cache_size=keys), limiter=limiter)
    steps: list[float] = []
    real = limiter.reclaim

    def timed(*args: Any, **kw: Any) -> tuple[int, bool]:
        started = time.perf_counter()
        try:
            return real(*args, **kw)
        finally:
            steps.append(time.perf_counter() - started)

    limiter.reclaim = timed  # type: ignore[method-assign]
    node.start_reclaiming()
    clock.now += 2000
    started = time.monotonic()
    while len(limiter):
        await asyncio.sleep(0.01)
    took = time.monotonic() - started
    await asyncio.sleep(1.5)  # the trim after the wave
    after = rss_mb()
    await node.close()
    return {
        "base": base,
        "full": full,
        "after": after,
        "took": took,
        "steps": len(steps),
        "median_ms": statistics.median(steps) * 1000,
        "max_ms": max(steps) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for _ in range(args.runs):
        r = asyncio.run(run(args.keys))
        print(
            f"RSS baseline {r['base']} MB, {args.keys:,} keys {r['full']} MB, after the "
            f"sweep {r['after']} MB; emptied {r['took']:.2f} s after expiry (sweep timer "
            f"1 s), {r['steps']} steps, median {r['median_ms']:.1f} ms, "
            f"max {r['max_ms']:.1f} ms"
        )


if __name__ == "__main__":
    main()
