"""LocalLimiter's cost per check against Python's in-memory rate limiters, same run.

Run: python bench/limiter.py [--checks 1000000] [--keys 10000]. Installs the peers
when missing (``pip install limits throttled-py``; they are not smockron dependencies).
Each round makes a fresh limiter and sends ``checks`` hits round-robin over ``keys`` keys,
a quota of 100 per minute each (so a default round fills every key exactly to its limit);
prints the median of 5 rounds in microseconds per check:

* LocalLimiter for each algorithm, batches of 1,000 requests per ``check`` call (as the
  cluster's batching hands them over), with the compiled path and with the Python path
  (``_compiled = None``, a tenth of the checks over a tenth of the keys: the same hits per
  key), and one prebuilt request per call (the same tenth);
* LocalLimiter as a caller calls it: a request object built for every check, one per
  ``check`` call (the like-for-like row against the peers, which are called per check);
* the ``limits`` library's fixed window (``FixedWindowRateLimiter`` over
  ``MemoryStorage``, one ``hit`` per check) and throttled-py's GCRA
  (``Throttled(using="gcra")`` over ``MemoryStore``, one ``limit`` per check);
* the ratio of the fastest peer to each LocalLimiter figure.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import _common  # noqa: F401  # puts this checkout first on sys.path

from smockron.cluster.local import LocalLimiter, check_compiled
from smockron.cluster.model import Algorithm, RateLimitRequest

ROUNDS, BATCH, LIMIT, DURATION_MS = 5, 1000, 100, 60_000
Round = Callable[[], Callable[[], None]]
"""Sets up a fresh limiter and returns the timed part."""


def ensure_peers() -> None:
    missing = [
        p
        for p, m in (("limits", "limits"), ("throttled-py", "throttled"))
        if importlib.util.find_spec(m) is None
    ]
    if missing:
        print(f"installing {' '.join(missing)} (benchmark peers only)", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=True)


def median_us(make: Round, checks: int) -> float:
    times = []
    for _ in range(ROUNDS):
        run = make()
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) / checks * 1e6)
    return statistics.median(times)


def limiter_round(
    algorithm: Algorithm, checks: int, keys: int, compiled: bool, batch: int = BATCH
) -> Round:
    reqs = [
        RateLimitRequest("bench", f"k{i}", 1, LIMIT, DURATION_MS, algorithm=algorithm)
        for i in range(keys)
    ]
    batches = [
        [reqs[i % keys] for i in range(start, min(start + batch, checks))]
        for start in range(0, checks, batch)
    ]

    def make() -> Callable[[], None]:
        limiter = LocalLimiter(max_keys=keys)
        if not compiled:
            limiter._compiled = None
        check = limiter.check

        def run() -> None:
            for b in batches:
                check(b)

        return run

    return make


def built_round(checks: int, keys: int) -> Round:
    """LocalLimiter as a caller calls it: a RateLimitRequest built for every check and
    handed over alone (what the ``limits`` and throttled-py rows pay: one call a check)."""
    names = [f"k{i}" for i in range(keys)]

    def make() -> Callable[[], None]:
        check = LocalLimiter(max_keys=keys).check

        def run() -> None:
            for i in range(checks):
                check([RateLimitRequest("bench", names[i % keys], 1, LIMIT, DURATION_MS)])

        return run

    return make


def limits_round(checks: int, keys: int) -> Round:
    from limits import parse, storage, strategies

    item, names = parse(f"{LIMIT}/minute"), [f"k{i}" for i in range(keys)]

    def make() -> Callable[[], None]:
        hit = strategies.FixedWindowRateLimiter(storage.MemoryStorage()).hit

        def run() -> None:
            for i in range(checks):
                hit(item, names[i % keys])

        return run

    return make


def throttled_round(checks: int, keys: int) -> Round:
    from throttled import MemoryStore, Throttled, per_min

    names = [f"k{i}" for i in range(keys)]

    def make() -> Callable[[], None]:
        limit = Throttled(using="gcra", quota=per_min(LIMIT), store=MemoryStore()).limit

        def run() -> None:
            for i in range(checks):
                limit(names[i % keys])

        return run

    return make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checks", type=int, default=1_000_000, help="checks per round")
    parser.add_argument("--keys", type=int, default=10_000)
    args = parser.parse_args()
    checks, keys = args.checks, args.keys
    slow, slow_keys = max(BATCH, checks // 10), max(1, keys // 10)
    ensure_peers()
    print(f"median of {ROUNDS} rounds, {checks:,} checks over {keys:,} keys, us per check")
    peers = {
        "limits FixedWindow (memory)": median_us(limits_round(checks, keys), checks),
        "throttled-py GCRA (memory)": median_us(throttled_round(checks, keys), checks),
    }
    fastest = min(peers.values())
    for name, us in peers.items():
        print(f"{name:34s} {us:6.2f}")
    if check_compiled is None:
        print("smockron.cluster._localfast is not built: compiled figures are Python's")
    for algorithm in Algorithm:
        fast = median_us(limiter_round(algorithm, checks, keys, True), checks)
        pure = median_us(limiter_round(algorithm, slow, slow_keys, False), slow)
        print(
            f"LocalLimiter {algorithm.name:17s}     {fast:6.2f}   {fastest / fast:4.1f}x faster"
            f" than the fastest peer   (Python path {pure:5.2f}, {pure / fast:4.1f}x slower)"
        )
    one = limiter_round(Algorithm.TOKEN_BUCKET, slow, slow_keys, True, batch=1)
    one_us = median_us(one, slow)
    print(f"LocalLimiter TOKEN_BUCKET, 1 per call {one_us:6.2f}   {fastest / one_us:4.1f}x")
    built = median_us(built_round(checks, keys), checks)
    print(
        f"LocalLimiter TOKEN_BUCKET, request built per check, 1 per call (as callers call) "
        f"{built:6.2f}   {fastest / built:4.1f}x"
    )


if __name__ == "__main__":
    main()
