"""The master's instructions per message for a domain of several rules against each of
its rules alone, counted by callgrind: does a domain of R rules cost more than its R
rules applied one by one?

    python bench/rule_instructions.py [--algorithms history,gcra] [--steps -1,1]
        [--identifiers 2000] [--messages 10000] [--base OTHER_CHECKOUT]

``bench/master_engine.py`` compares ten rules with one rule, the loosest of them: its
tighter rules throttle more requests and charge more debt, so each does more work than
the one. Here the same ten rules (``master_engine.rules_for``: ``2r`` down to ``1.1r``,
step -1, or up to ``2.9r``, step 1, burst 10, ``r`` an identifier's mean rate) are
measured as one domain and each as a domain of its own, under the same load (the same
random identifiers at 100 messages a millisecond); the goal "a domain of R rules costs at
most R times one rule" holds if the domain costs at most the sum of its rules alone.

Each figure: the engine warmed up with 12 requests per identifier, then ``--messages``
and three times as many, each run under ``valgrind --tool=callgrind``; the difference of
the two totals over the difference in messages, less the load generation's own (measured
the same way with the engine not called). Load-independent, so it can be compared on a
shared machine; a run of both algorithms and steps takes 10 to 30 minutes. Needs valgrind.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
from pathlib import Path

from _common import ROOT, callgrind_instructions

RULES = 10
WARM = 12


def measured(algorithm: str, step: int, which: str, identifiers: int, messages: int) -> None:
    """The process callgrind counts: ``which`` (comma-separated indexes into the ten
    rules, or empty: the load alone) as one domain, warmed up, then ``messages``."""
    import master_engine as me

    from smockron.master.domains import DomainPolicy
    from smockron.master.engine import Engine
    from smockron.master.stores.memory import MemoryStore

    rules = me.rules_for(identifiers, RULES, step)
    chosen = tuple(rules[int(k)] for k in which.split(",")) if which else rules[:1]
    eng = Engine({"api": DomainPolicy(chosen, algorithm)}, MemoryStore(now_ms=float(me.T0)))
    load = me.Load(identifiers)
    for batch in load.batches(eng, WARM * identifiers, fresh=False):
        if which:
            me.drive(eng, [batch])
    batches = list(load.batches(eng, messages, fresh=True))
    gc.collect()
    if which:
        me.drive(eng, batches)


def instructions(tree: Path, args: list[str]) -> int:
    """Every instruction of one measured process."""
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{ROOT / 'bench'}")
    return callgrind_instructions([__file__, "--measure", *args], env)


def per_message(tree: Path, case: list[str], messages: int) -> float:
    low = instructions(tree, [*case, str(messages)])
    high = instructions(tree, [*case, str(3 * messages)])
    return (high - low) / (2 * messages)


def compare(tree: Path, algorithm: str, step: int, identifiers: int, messages: int) -> None:
    def cost(which: str) -> float:
        case = [algorithm, str(step), which, str(identifiers)]
        return per_message(tree, case, messages) - load

    load = per_message(tree, [algorithm, str(step), "", str(identifiers)], messages)
    domain = cost(",".join(str(k) for k in range(RULES)))
    alone = [cost(str(k)) for k in range(RULES)]
    shape = "down to 1.1r" if step < 0 else "up to 2.9r"
    print(
        f"{tree.name or tree}: {algorithm}, {RULES} rules from 2r {shape}, {identifiers:,} "
        f"identifiers (load generation {load:,.0f} a message, taken off):\n"
        f"  each rule alone: {', '.join(f'{a:,.0f}' for a in alone)}\n"
        f"  the ten alone, summed: {sum(alone):,.0f}; the domain of ten: {domain:,.0f} "
        f"= {domain / sum(alone):.2f}x the sum (goal <= 1x), {domain / alone[0]:.2f}x "
        f"the first rule (2r) alone",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--measure", nargs=5, metavar="ARG", help=argparse.SUPPRESS)
    ap.add_argument("--algorithms", default="history,gcra")
    ap.add_argument("--steps", default="-1,1")
    ap.add_argument("--identifiers", type=int, default=2000)
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--base", type=Path, default=None, help="another checkout, measured too")
    args = ap.parse_args()
    if args.measure:
        alg, step, which, identifiers, messages = args.measure
        measured(alg, int(step), which, int(identifiers), int(messages))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind not found (apt-get install valgrind)")
    trees = [ROOT] + ([args.base.resolve()] if args.base else [])
    for algorithm in args.algorithms.split(","):
        for step in (int(s) for s in args.steps.split(",")):
            for tree in trees:
                compare(tree, algorithm, step, args.identifiers, args.messages)


if __name__ == "__main__":
    main()
