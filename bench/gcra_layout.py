"""What a domain's GCRA rules cost by how their states are laid out in memory.

    python bench/gcra_layout.py [--identifiers 10000] [--messages 400000] [--rules 10]

The master's GCRA loop in plain Python, without the engine around it: a state read, moved
on and written per rule and message, for identifiers drawn at random (a new identifier
object per message, as the receive loop makes them). Three layouts, each with one rule
and with ``--rules``: a dictionary per rule holding a 1-tuple per identifier (the memory
store's today), a dictionary per rule all holding one shared R-tuple, and one dictionary
per domain holding one R-tuple per identifier. CPU us a message and the ratio of
``--rules`` rules to one: what each layout would make of "R rules cost at most R times
one rule", within the layout and against one rule held as today.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

Loop = Callable[[list[bytes], list[bytes], int], float]


def per_rule(keys: list[bytes], msgs: list[bytes], rules: int) -> float:
    tables = [dict.fromkeys(keys, (1.0,)) for _ in range(rules)]
    ts = 0.0
    start = time.process_time()
    for ident in msgs:
        ts += 0.01
        for table in tables:
            state = table.get(ident)
            value = (ts if not state or state[0] < ts else state[0]) + 0.5
            table[ident] = (value,)
    return time.process_time() - start


def shared_state(keys: list[bytes], msgs: list[bytes], rules: int) -> float:
    tables = [dict.fromkeys(keys, (1.0,) * rules) for _ in range(rules)]
    first = tables[0]
    ts = 0.0
    start = time.process_time()
    for ident in msgs:
        ts += 0.01
        state = first.get(ident) or (ts,) * rules
        new = tuple([(ts if v < ts else v) + 0.5 for v in state])
        for table in tables:
            table[ident] = new
    return time.process_time() - start


def per_domain(keys: list[bytes], msgs: list[bytes], rules: int) -> float:
    table = dict.fromkeys(keys, (1.0,) * rules)
    ts = 0.0
    start = time.process_time()
    for ident in msgs:
        ts += 0.01
        state = table.get(ident) or (ts,) * rules
        table[ident] = tuple([(ts if v < ts else v) + 0.5 for v in state])
    return time.process_time() - start


LAYOUTS: dict[str, Loop] = {
    "a dictionary per rule, a 1-tuple each": per_rule,
    "a dictionary per rule, one shared R-tuple": shared_state,
    "one dictionary per domain, an R-tuple each": per_domain,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--identifiers", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--rules", type=int, default=10)
    args = parser.parse_args()
    rng = random.Random(1)
    keys = [b"id-%d" % i for i in range(args.identifiers)]
    msgs = [bytes(keys[rng.randrange(len(keys))]) for _ in range(args.messages)]
    print(f"{args.identifiers:,} identifiers, {args.messages:,} messages; CPU us a message")
    today = 0.0
    for name, loop in LAYOUTS.items():
        one = loop(keys, msgs, 1) / len(msgs) * 1e6
        many = loop(keys, msgs, args.rules) / len(msgs) * 1e6
        today = today or one  # the first layout is today's
        print(
            f"  {name:45} 1 rule {one:6.3f}  {args.rules} rules {many:6.3f}  "
            f"ratio {many / one:5.2f}x  against today's 1 rule {many / today:5.2f}x"
        )


if __name__ == "__main__":
    main()
