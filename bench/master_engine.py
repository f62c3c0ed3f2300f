"""The master's engine in process, without sockets: what a message costs in CPU time.

    python bench/master_engine.py [--runs 3] [--messages 200000] [--only history]
    python bench/master_engine.py --mode decode [--runs 7]
    python bench/master_engine.py --mode connections [--runs 3] [--connections 16]
    PYTHONPATH=/path/to/other/checkout python bench/master_engine.py   # A/B two trees

``--mode costs`` (the default): how the cost per message grows with the work. Cases:
``history`` and ``gcra``, a domain of 1 rule and one of 10 rules, 10,000 and 1,000,000
identifiers (10 rules with 10,000 only: a million identifiers under ten history rules
hold gigabytes). The engine is driven as the server drives it: ``store.tick`` and
``Engine.apply`` on records decoded beforehand (a fresh identifier and timestamp object
per message, as the receive loop makes them), in batches of 256, 100 messages per
millisecond of the clock (100,000 a second), identifiers drawn at random. The rules are
scaled to the number of identifiers so that each identifier sees the same load in
every case and only their number changes: an identifier sends on average ``r = 100,000 /
identifiers`` requests a second, the one rule allows ``2r`` with a burst of 10 (``20/s:10``
for 10,000 identifiers, ``0.2/s:10`` for a million). Ten rules twice: ``2r``, ``1.9r``,
... ``1.1r`` (tighter rules: far more requests throttled, and debt, than under the one
rule) and ``2r``, ``2.1r``, ... ``2.9r`` (the one rule is the tightest: the same requests
throttled, so the ratio is the rules' own cost), each with a burst of 10; and the one
rule at ``1.1r``, the tightest of the first ten alone: ten rules down to ``1.1r`` against
it are ten rules against one of them, the same requests throttled. Before it is
measured, each case runs ``--warm`` requests per identifier (histories full, the
generations rotated), then ``--runs`` rounds of ``--messages`` each, continuing the same
clock; CPU time of this process, medians. Ratios printed: 10 rules against 1 rule (and
against the one rule at ``1.1r``), 1,000,000 identifiers against 10,000. ``--processes
N``: each case measured in N fresh processes, the cases taken in turn, the median of their
medians: on this machine a process's memory placement moves a case's cost by up to 1.8x
for all its rounds, which the rounds of one process do not average out.

``--mode decode``: ``records`` (``ingest`` + ``apply`` on what the compiled receive loop
returns) and ``frames`` (``Engine.process``: the pure-Python decode, then ``apply``),
200,000 messages over 2,000 identifiers ruled ``1/m:30``.

``--mode connections``: the same total load sent by 1 and by ``--connections`` PUB
sockets (one sender process each) to a real ``smockron master``, stopped while they send
and then resumed: its drain rate (messages handled per second of wall time), as
``bench/master_throughput.py`` measures it.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

from smockron.core.rules import Rule
from smockron.master.domains import DomainPolicy
from smockron.master.engine import Engine
from smockron.master.stores.memory import MemoryStore

try:
    from smockron.wire.codec import ACCEPTED, encode_accounting
except ImportError:  # a tree from before smockron.wire, for an A/B run
    from smockron.protocol import ACCEPTED, encode_accounting  # type: ignore[no-redef]

T0 = 1_700_000_000_000
BATCH = 256
PER_MS = 100
"""Messages per millisecond of the clock."""

# ---------------------------------------------------------------- costs

Batch = list[tuple[object, ...]]


def rules_for(identifiers: int, count: int, step: int = -1, first: int = 20) -> tuple[Rule, ...]:
    """``count`` rules allowing 2, 1.9, ... (``step`` -1) or 2, 2.1, ... (+1) times an
    identifier's mean rate (``first`` tenths of it for the first), burst 10."""
    rate = PER_MS * 1000 / identifiers
    return tuple(Rule(rate * (first + step * k) / 10, 10) for k in range(count))


class Load:
    """Random identifiers out of ``identifiers``, ``PER_MS`` messages a millisecond."""

    def __init__(self, identifiers: int, seed: int = 1) -> None:
        self.idents = [b"id%07d" % i for i in range(identifiers)]
        self.rand = random.Random(seed)
        self.sent = 0

    def now(self) -> float:
        return float(T0 + self.sent // PER_MS)

    def batches(self, eng: Engine, count: int, fresh: bool) -> Iterator[Batch]:
        """``count`` messages as decoded records, a batch at a time; ``fresh``: a new
        identifier object for each (as received), else the load's own (warm-up)."""
        dom = eng.topics[b"api\0"]
        choices = self.rand.choices
        for start in range(0, count, BATCH):
            size = min(BATCH, count - start)
            idents = choices(self.idents, k=size)
            if fresh:
                idents = [bytes(bytearray(i)) for i in idents]
            first = self.sent
            batch: Batch = [
                (dom, ACCEPTED, ident, float(T0 + (first + k) // PER_MS), None)
                for k, ident in enumerate(idents)
            ]
            self.sent += size
            yield batch


def drive(eng: Engine, batches: list[Batch]) -> tuple[float, int]:
    """Apply decoded batches as the server does; (CPU seconds, DELAY_UNTILs)."""
    tick, apply = eng.store.tick, eng.apply
    published = 0
    start = time.process_time()
    for batch in batches:
        now = batch[-1][3]
        tick(now)  # type: ignore[arg-type]
        published += len(apply(batch, now, now))  # type: ignore[arg-type]
    return time.process_time() - start, published


Case = tuple[str, int, int, int, int]
"""Algorithm, rules, step, identifiers and the first rule's rate in tenths of ``r``."""


def cost_case(
    algorithm: str, rules: int, step: int, identifiers: int, first: int, args: argparse.Namespace
) -> tuple[float, float]:
    """Median CPU microseconds per message and the share answered with a DELAY_UNTIL."""
    policy = {"api": DomainPolicy(rules_for(identifiers, rules, step, first), algorithm)}
    load = Load(identifiers)
    eng = Engine(policy, MemoryStore(now_ms=load.now()))
    for batch in load.batches(eng, args.warm * identifiers, fresh=False):
        drive(eng, [batch])
    costs, published = [], 0
    for _ in range(args.runs):
        batches = list(load.batches(eng, args.messages, fresh=True))
        gc.collect()
        seconds, published = drive(eng, batches)
        del batches
        costs.append(seconds / args.messages * 1e6)
    return statistics.median(costs), published / args.messages


def cost_process(case: Case, args: argparse.Namespace) -> tuple[float, float]:
    """``cost_case`` in a fresh interpreter (``--processes``)."""
    argv = [sys.executable, __file__, "--case", json.dumps(case), "--runs", str(args.runs)]
    argv += ["--messages", str(args.messages), "--warm", str(args.warm)]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    us, throttled = json.loads(out.strip().splitlines()[-1])
    return float(us), float(throttled)


def costs(args: argparse.Namespace) -> None:
    shapes = (
        (1, -1, 10_000, 20),
        (10, -1, 10_000, 20),
        (10, 1, 10_000, 20),
        (1, -1, 1_000_000, 20),
        (1, -1, 10_000, 11),
    )
    cases = [
        (alg, *shape)
        for alg in ("history", "gcra")
        for shape in shapes
        if not args.only or args.only == alg
    ]
    print(
        f"{args.messages} messages per round, {args.runs} rounds, warm-up "
        f"{args.warm} requests per identifier; CPU us per message (median)"
    )
    if args.processes > 1:
        print(
            f"each case in {args.processes} processes of its own, the cases taken in turn; "
            "the median of their medians (a process's memory placement moves a case's "
            "cost by up to 1.8x on this machine, the same for all its rounds)"
        )
    got: dict[Case, float] = {}
    by_case: dict[Case, list[tuple[float, float]]] = {c: [] for c in cases}
    for _ in range(args.processes):
        for case in cases:
            by_case[case].append(
                cost_case(*case, args) if args.processes == 1 else cost_process(case, args)
            )
    for case, results in by_case.items():
        alg, rules, step, n, first = case
        us = statistics.median(r[0] for r in results)
        throttled = statistics.median(r[1] for r in results)
        got[case] = us
        shape = (
            f" at {first / 10}r" if rules == 1 else " down to 1.1r" if step < 0 else " from 2r up"
        )
        spread = f" [{', '.join(f'{r[0]:.3f}' for r in results)}]" if args.processes > 1 else ""
        print(
            f"  {alg:8} {rules:2} rule(s){shape:13} {n:>9,} identifiers: {us:6.3f} us "
            f"({throttled:.0%} answered with a DELAY_UNTIL){spread}",
            flush=True,
        )
    for alg in ("history", "gcra"):
        if (alg, 1, -1, 10_000, 20) not in got:
            continue
        one, tight = got[alg, 1, -1, 10_000, 20], got[alg, 1, -1, 10_000, 11]
        down, up = got[alg, 10, -1, 10_000, 20], got[alg, 10, 1, 10_000, 20]
        print(
            f"{alg}: 10 rules / 1 rule = {down / one:.2f}x (down to 1.1r), "
            f"{up / one:.2f}x (from 2r up), {down / tight:.2f}x (down to 1.1r against one "
            f"rule at 1.1r) (goal <= 10x); "
            f"1,000,000 / 10,000 identifiers = {got[alg, 1, -1, 1_000_000, 20] / one:.2f}x"
            + (" (goal <= 2x)" if alg == "history" else "")
        )


# ---------------------------------------------------------------- decode


def decode_engine() -> Engine:
    policy = {"api": DomainPolicy((Rule(1 / 60, 30),))}
    return Engine(policy, MemoryStore(), skew_tolerance_ms=1e12)


def messages(n: int) -> list[list[bytes]]:
    return [
        encode_accounting("api", ACCEPTED, b"id%d" % (i % 2_000), T0 + i // 100, None, b"ua")
        for i in range(n)
    ]


def run_records(msgs: list[list[bytes]]) -> tuple[float, int]:
    eng = decode_engine()
    batches = [eng.decode(msgs[s : s + BATCH]) for s in range(0, len(msgs), BATCH)]
    published = 0
    start = time.process_time()
    for i, records in enumerate(batches):
        now = T0 + i * BATCH // 100
        eng.store.tick(now)
        published += len(eng.apply(eng.ingest(records, []), now))
    return time.process_time() - start, published


def run_frames(msgs: list[list[bytes]]) -> tuple[float, int]:
    eng = decode_engine()
    published = 0
    start = time.process_time()
    for s in range(0, len(msgs), BATCH):
        published += len(eng.process(msgs[s : s + BATCH], T0 + s // 100))
    return time.process_time() - start, published


def decode(args: argparse.Namespace) -> None:
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
        print(
            f"{name}: median {statistics.median(rates):,.0f} messages/s of CPU, "
            f"{published} DELAY_UNTIL"
        )


# ---------------------------------------------------------------- connections


def connections(args: argparse.Namespace) -> None:
    import os
    import tempfile
    from pathlib import Path

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import master_throughput as mt  # the load, the senders and the drain measure

    total = sum(n for _, n in mt.workload(args.messages))
    print(
        f"{total} messages per run from 1 and from {args.connections} PUB connections "
        f"(one process each) to one master; drain rate, wall time"
    )
    rates: dict[int, list[float]] = {1: [], args.connections: []}
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            line = f"run {run + 1}:"
            for n in rates:
                rate, info = mt.measure_master(args.messages, n, "memory://", Path(tmp))
                rates[n].append(rate)
                line += f" {n} connection(s) {rate:,.0f}/s ({info});"
            print(line, flush=True)
    one, many = statistics.median(rates[1]), statistics.median(rates[args.connections])
    print(
        f"median: 1 connection {one:,.0f}/s, {args.connections} connections {many:,.0f}/s "
        f"= {many / one:.2f}x (goal >= 1x)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--mode", choices=("costs", "decode", "connections"), default="costs")
    ap.add_argument("--messages", type=int, default=None)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warm", type=int, default=12, help="requests per identifier first")
    ap.add_argument("--only", choices=("history", "gcra"), default=None)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument(
        "--processes", type=int, default=1, help="costs: each case in N fresh processes"
    )
    ap.add_argument("--case", default=None, help=argparse.SUPPRESS)  # one case, as JSON
    args = ap.parse_args()
    if args.case is not None:  # a --processes child: one case, its result as JSON
        args.messages = args.messages or 200_000
        alg, rules, step, n, first = json.loads(args.case)
        print(json.dumps(cost_case(alg, rules, step, n, first, args)))
    elif args.mode == "costs":
        args.messages = args.messages or 200_000
        costs(args)
    elif args.mode == "decode":
        args.messages = args.messages or 200_000
        decode(args)
    else:
        args.messages = args.messages or 400_000
        connections(args)


if __name__ == "__main__":
    main()
