"""Sweeps of large tables: how long they hold a daemon's loop.

A gatekeeper forgets passed DELAY_UNTILs and first-line times once a second
(``SWEEP_INTERVAL_S``), scanning its tables whole; with a million identifiers delayed
(a large attack) that scan is a pause every request waiting on the loop sees. This
times the scans of a delay table (int times) and of a first line's times (floats)
holding ``--entries`` live entries (and of a first line under several rules: a tuple of
times each), nothing passed, with the compiled twin
(``_tablefast.passed``) and the Python one, in the same run.

Then DThrottle's report, which forgets the buckets full again: with ``--entries`` tags
live, then all of them full again, each report's pause, looking at ``SWEEP_SLICE``
buckets (the default) and at all of them at once (as before the slices), in the same
run.

Run: python bench/sweep.py [--entries 1000000] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from smockron.daemons.dthrottle import algorithm
from smockron.daemons.dthrottle.algorithm import PrefixRule, RuleTable, Throttle
from smockron.gatekeeper._table import passed_compiled, passed_python

NOW = 1_700_000_000_000


def timed(
    fn: Callable[[dict[Any, Any], int], list[Any]], table: dict[Any, Any], runs: int
) -> float:
    """Median milliseconds of ``runs`` scans."""
    took = []
    for _ in range(runs):
        start = time.perf_counter()
        gone = fn(table, NOW)
        took.append((time.perf_counter() - start) * 1000)
        assert not gone
    return statistics.median(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if passed_compiled is None:
        raise SystemExit("smockron.gatekeeper._tablefast is not built")
    n = args.entries
    delays: dict[Any, float] = {(b"api", b"id-%d" % i): NOW + 3_600_000 for i in range(n)}
    firsts: dict[Any, float] = {b"id-%d" % i: NOW + 3_600_000.5 for i in range(n)}
    several: dict[Any, Any] = {
        (b"api", b"id-%d" % i): (NOW + 3_600_000.5, NOW - 1.5) for i in range(n)
    }
    print(f"sweep of {n:,} live entries, median of {args.runs} (ms)")
    for name, table in (
        ("delay table (int times)", delays),
        ("first line (float times)", firsts),
        ("first line, several rules", several),
    ):
        python = timed(passed_python, table, args.runs)
        compiled = timed(passed_compiled, table, args.runs)
        print(
            f"  {name:26}: Python {python:6.1f}, compiled {compiled:5.1f} "
            f"({python / compiled:.1f}x faster)"
        )
    del delays, firsts, several
    dthrottle_main(n)


def dthrottle_reports(n: int, reports: int) -> tuple[list[float], list[float]]:
    """Each report's pause (ms) with ``n`` tags live, then with all of them full again."""
    throttle = Throttle(RuleTable(PrefixRule(b"", burst=1, rate=1 / 3600)))
    for i in range(n):
        throttle.allow(b"t%d" % i, 100.0)
    pauses: tuple[list[float], list[float]] = ([], [])
    for now, out in ((101.0, pauses[0]), (100_000.0, pauses[1])):
        for _ in range(reports):
            start = time.perf_counter()
            throttle.take_report(now)
            out.append((time.perf_counter() - start) * 1000)
            if not throttle.buckets:
                break
    return pauses


def dthrottle_main(n: int) -> None:
    print(f"DThrottle report with {n:,} tags, pause per report (ms): median / max")
    slices = -(-n // algorithm.SWEEP_SLICE)
    for name, size in (
        (f"slices of {algorithm.SWEEP_SLICE:,}", algorithm.SWEEP_SLICE),
        ("the whole table at once", n + 1),
    ):
        algorithm.SWEEP_SLICE = size  # type: ignore[misc]
        live, full = dthrottle_reports(n, min(slices, 20))
        print(
            f"  {name:26}: all live {statistics.median(live):6.1f} / {max(live):6.1f}; "
            f"all full {statistics.median(full):6.1f} / {max(full):6.1f} "
            f"({len(full)} report(s) to forget them)"
        )


if __name__ == "__main__":
    main()
