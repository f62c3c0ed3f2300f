"""What a message costs the master by the burst of its rule: the history rule keeps up to
``burst`` timestamps per identifier and reads and rewrites them at every message; GCRA
keeps one value.

    python bench/history_burst.py [--messages 50000] [--bursts 300,1000,3000,10000]

One identifier, messages 10 us apart, the engine driven as in bench/master_engine.py
(``Engine.apply`` on decoded records, in batches of 256, GCRA taking a batch at one
instant), a rule of a million a second: with a burst of 256 or more it never throttles
them, and the history fills to ``burst`` timestamps before the measured messages. CPU
us a message for ``history`` and ``gcra`` at each burst, and the ratio to the smallest;
and ``history x2``: a domain of two such history rules, of bursts ``burst`` and half of
it (the several-rule path: two states, each judged).
"""

from __future__ import annotations

import argparse
import time

from smockron.core.rules import Rule
from smockron.master.domains import DomainPolicy
from smockron.master.engine import Engine
from smockron.master.stores.memory import MemoryStore
from smockron.wire.codec import ACCEPTED, encode_accounting

T0 = 1_700_000_000_000.0
BATCH = 256


def cost(algorithm: str, burst: int, messages: int, rules: int = 1) -> float:
    store = MemoryStore(now_ms=T0)
    # a rate of 1e6 requests a second: 10 us apart never reach it
    domain_rules = tuple(Rule(1_000_000.0, burst >> k) for k in range(rules))
    engine = Engine({"api": DomainPolicy(domain_rules, algorithm)}, store)
    frames = encode_accounting("api", ACCEPTED, b"client", int(T0))
    (record,) = engine.decode([frames])
    dom, status, ident = record[0], record[1], record[2]

    def run(count: int, start: float) -> float:
        now = start
        for first in range(0, count, BATCH):
            batch = []
            for _ in range(min(BATCH, count - first)):
                now += 0.01
                batch.append((dom, status, bytes(ident), now, None))
            store.tick(now)
            engine.apply(batch, now)
        return now

    now = run(burst + 10, T0)  # the history full
    begin = time.process_time()
    run(messages, now)
    return (time.process_time() - begin) / messages * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--bursts", default="300,1000,3000,10000")
    args = parser.parse_args()
    bursts = [int(b) for b in args.bursts.split(",")]
    print(
        f"{args.messages:,} messages of one identifier; CPU us a message "
        f"(ratio to burst {bursts[0]})"
    )
    for algorithm, rules, label in (
        ("history", 1, "history"),
        ("history", 2, "history x2"),
        ("gcra", 1, "gcra"),
    ):
        base = 0.0
        for burst in bursts:
            us = cost(algorithm, burst, args.messages, rules)
            base = base or us
            print(f"  {label:10} burst {burst:>6,}: {us:8.3f} us  ({us / base:6.1f}x)")


if __name__ == "__main__":
    main()
