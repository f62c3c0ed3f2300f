"""What observability adds to the master's publishing path, per DELAY_UNTIL.

    python bench/observe_overhead.py [--rounds 7]

With ``--metrics`` the master counts each DELAY_UNTIL it publishes per (domain,
identifier) for ``/stats`` and ``smockron top`` (smockron/observe/throttled.py). This
times ``TopThrottled.add`` on batches of 64 controls (the master's publishing slice):
with 50 identifiers (counts bumped), and with 12,800 distinct ones against the 10,000
cap (inserts, then only the ``others`` count). Median of the rounds, in ns a control.
"""

from __future__ import annotations

import argparse
import statistics
import time

from smockron.observe.throttled import TopThrottled

SLICE = 64


def controls(identifiers: int, total: int) -> list[list[list[bytes]]]:
    frames = [
        [b"api\0", b"DELAY_UNTIL", b"user-%d" % (i % identifiers), b"1700000000000"]
        for i in range(total)
    ]
    return [frames[i : i + SLICE] for i in range(0, total, SLICE)]


def round_ns(batches: list[list[list[bytes]]]) -> float:
    top = TopThrottled()
    start = time.perf_counter()
    for batch in batches:
        top.add(batch, 1.0)
    return (time.perf_counter() - start) / sum(map(len, batches)) * 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    for label, identifiers in (("50 identifiers", 50), ("12,800 distinct", 12_800)):
        batches = controls(identifiers, 12_800)
        runs = [round_ns(batches) for _ in range(args.rounds)]
        print(
            f"{label}: median {statistics.median(runs):.0f} ns a control "
            f"(min {min(runs):.0f}, max {max(runs):.0f})"
        )


if __name__ == "__main__":
    main()
