"""The master's engine in process, without sockets: what a batch costs in CPU time.

    python bench/master_engine.py [--messages 200000] [--runs 7]
    PYTHONPATH=/path/to/other/checkout python bench/master_engine.py   # A/B two trees

Two cases, each on 200,000 six-frame ACCEPTED messages (2,000 identifiers, one domain
ruled ``1/m:30``: 71% of the messages get a DELAY_UNTIL), in batches of 256:

- ``records``: ``Engine.ingest`` + ``Engine.apply`` on records as the compiled receive
  loop (``smockron.wire._zmqfast``) returns them: what a production master runs per batch;
- ``frames``: ``Engine.process`` on frames: the pure-Python decode (``split_accounting``
  and the codec), as without the compiled extension, then ``apply``.

CPU time of this process (``time.process_time``), median of ``--runs``: on a shared
machine other processes' load distorts wall-clock time far more.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from smockron.core.rules import Rule
from smockron.master.engine import DomainPolicy, Engine
from smockron.master.stores.memory import MemoryStore

try:
    from smockron.wire.codec import ACCEPTED, encode_accounting
except ImportError:  # a tree from before smockron.wire, for an A/B run
    from smockron.protocol import ACCEPTED, encode_accounting  # type: ignore[no-redef]

T0 = 1_700_000_000_000
BATCH = 256


def engine() -> Engine:
    policy = {"api": DomainPolicy((Rule(1 / 60, 30),))}
    return Engine(policy, MemoryStore(), skew_tolerance_ms=1e12)


def messages(n: int) -> list[list[bytes]]:
    return [encode_accounting("api", ACCEPTED, b"id%d" % (i % 2_000), T0 + i // 100, None, b"ua")
            for i in range(n)]  # fmt: skip


def run_records(msgs: list[list[bytes]]) -> tuple[float, int]:
    eng = engine()
    batches = [eng.decode(msgs[s : s + BATCH]) for s in range(0, len(msgs), BATCH)]
    published = 0
    start = time.process_time()
    for i, records in enumerate(batches):
        now = T0 + i * BATCH // 100
        eng.store.tick(now)
        published += len(eng.apply(eng.ingest(records, []), now))
    return time.process_time() - start, published


def run_frames(msgs: list[list[bytes]]) -> tuple[float, int]:
    eng = engine()
    published = 0
    start = time.process_time()
    for s in range(0, len(msgs), BATCH):
        published += len(eng.process(msgs[s : s + BATCH], T0 + s // 100))
    return time.process_time() - start, published


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    msgs = messages(args.messages)
    cases: dict[str, Callable[[list[list[bytes]]], tuple[float, int]]] = {
        "records (after the compiled receive loop)": run_records,
        "frames (pure-Python decode)": run_frames,
    }
    for name, case in cases.items():
        rates, published = [], 0
        for _ in range(args.runs):
            seconds, published = case(msgs)
            rates.append(len(msgs) / seconds)
        print(f"{name}: median {statistics.median(rates):,.0f} messages/s of CPU, "
              f"{published} DELAY_UNTIL")  # fmt: skip


if __name__ == "__main__":
    main()
