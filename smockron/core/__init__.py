"""The pure core: rate-limit algorithms, rule syntax and the one vocabulary of names.

Nothing here does I/O or reads a clock: every function takes ``now`` as an argument,
so each algorithm is tested exactly and shared by every front end.
"""

from __future__ import annotations

from smockron.core.bucket import RefillBucket
from smockron.core.gcra import gcra_update
from smockron.core.history import History, next_allowed, record
from smockron.core.rules import Rule, parse_rate, parse_rule_spec
from smockron.core.vocabulary import ALGORITHMS, Algorithm

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "History",
    "RefillBucket",
    "Rule",
    "gcra_update",
    "next_allowed",
    "parse_rate",
    "parse_rule_spec",
    "record",
]
