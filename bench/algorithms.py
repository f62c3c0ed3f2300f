"""Throughput of the pure algorithms and of LocalLimiter.check, per algorithm.

Run: python bench/algorithms.py [--keys 1000000]. Prints the median of 5 runs
(microseconds per check and checks per second) for each algorithm, through LocalLimiter
(1,000 keys, 1,000 checks per call) and through algorithms.check alone; plus
HashRing.owner for cached and new keys. ``--keys N`` adds the pause of a full garbage
collection while a LocalLimiter holds N keys (a quarter of each algorithm).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from _common import full_gc_ms  # puts this checkout first on sys.path

from smockron.cluster.local import LocalLimiter
from smockron.cluster.model import Algorithm, RateLimitRequest
from smockron.core.algorithms import LimitParams, State, check
from smockron.core.hashring import HashRing

RUNS, CALLS, BATCH = 5, 10, 1000


def median_us(fn: Callable[[], None], per_run: int) -> float:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) / per_run * 1e6)
    return statistics.median(times)


def bench_limiter(algorithm: Algorithm) -> float:
    limiter = LocalLimiter()
    reqs = [
        RateLimitRequest("bench", f"k{i}", 1, 100, 60_000, algorithm=algorithm)
        for i in range(BATCH)
    ]

    def run() -> None:
        for _ in range(CALLS):
            limiter.check(reqs)

    return median_us(run, CALLS * BATCH)


def bench_core(algorithm: Algorithm) -> float:
    params = LimitParams(1, 100, 60_000, 0, algorithm)
    now = int(time.time() * 1000)

    def run() -> None:
        state: State | None = None
        for i in range(CALLS * BATCH):
            state, _ = check(state, params, now + i)

    return median_us(run, CALLS * BATCH)


def bench_ring(fresh: bool) -> float:
    ring = HashRing([f"127.0.0.1:{1051 + i}" for i in range(3)])
    counter = iter(range(10**9))

    def run() -> None:
        for i in range(CALLS * BATCH):
            ring.owner(f"bench_k{next(counter) if fresh else i % 1000}")

    return median_us(run, CALLS * BATCH)


def gc_pause_ms(keys: int) -> float:
    """Median of 5 full collections while a LocalLimiter holds ``keys`` keys."""
    limiter = LocalLimiter(max_keys=max(keys, 1))
    algorithms = list(Algorithm)
    for start in range(0, keys, BATCH):
        limiter.check(
            [
                RateLimitRequest("gc", f"k{i}", 1, 100, 60_000, algorithm=algorithms[i % 4])
                for i in range(start, min(start + BATCH, keys))
            ]
        )
    return full_gc_ms()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=0, help="also time a full gc with N keys")
    args = parser.parse_args()
    print(f"median of {RUNS} runs, {CALLS * BATCH} checks each")
    for algorithm in Algorithm:
        lim, core = bench_limiter(algorithm), bench_core(algorithm)
        print(
            f"{algorithm.name:17s} LocalLimiter {lim:6.2f} us/check ({1e6 / lim:9,.0f}/s)"
            f"   algorithms.check {core:6.2f} us ({1e6 / core:9,.0f}/s)"
        )
    cached, fresh = bench_ring(False), bench_ring(True)
    print(f"HashRing.owner    cached key {cached:.2f} us   new key {fresh:.2f} us")
    if args.keys:
        pause = gc_pause_ms(args.keys)
        print(f"full gc.collect() with {args.keys:,} keys in a LocalLimiter: {pause:.1f} ms")


if __name__ == "__main__":
    main()
