"""One vocabulary of algorithm names for every front, in one table.

A Smockron domain (master, gatekeepers' first lines, RULES offers) names its algorithm
with a word: ``history``, ``gcra``, ``history-literal``. The cluster (Gubernator's wire)
numbers its algorithms with the :class:`Algorithm` enum. :data:`TABLE` holds both, so a
name means the same thing wherever it appears, and says which front runs what:

==================  ======  ==================  =========================================
name                domain  cluster enum        what it is
==================  ======  ==================  =========================================
history             yes     -                   the history rule, charging late-known
                                                requests as debt (the master's default)
history-literal     yes     SMOCKRON_HISTORY    the history rule exactly as written
gcra                yes     -                   the original master's GCRA
token-bucket        -       TOKEN_BUCKET        Gubernator's (a fixed window)
leaky-bucket        -       LEAKY_BUCKET        Gubernator's leaky bucket
sliding-window      -       SLIDING_WINDOW      two-window weighted counter
==================  ======  ==================  =========================================
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Final


class Algorithm(IntEnum):
    """The cluster's algorithm numbers: Gubernator's enum, then smockron's additions."""

    TOKEN_BUCKET = 0
    LEAKY_BUCKET = 1
    # smockron's additions, beyond Gubernator's enum
    SLIDING_WINDOW = 2
    SMOCKRON_HISTORY = 3


@dataclass(frozen=True, slots=True)
class AlgorithmName:
    """One row of the vocabulary."""

    name: str
    """The word used in flags, config files and RULES offers."""
    domain: bool
    """Whether a Smockron domain (the master and its gatekeepers) can run it."""
    cluster: Algorithm | None
    """The cluster's number for it, when the cluster runs it."""
    states: str | None
    """The master's name for its stored states: variants that keep the same states share
    it, so switching between them keeps them; None when the master does not run it."""


TABLE: Final = (
    AlgorithmName("history", True, None, "history"),
    AlgorithmName("gcra", True, None, "gcra"),
    AlgorithmName("history-literal", True, Algorithm.SMOCKRON_HISTORY, "history"),
    AlgorithmName("token-bucket", False, Algorithm.TOKEN_BUCKET, None),
    AlgorithmName("leaky-bucket", False, Algorithm.LEAKY_BUCKET, None),
    AlgorithmName("sliding-window", False, Algorithm.SLIDING_WINDOW, None),
)
BY_NAME: Final = {row.name: row for row in TABLE}

ALGORITHMS: Final = tuple(row.name for row in TABLE if row.domain)
"""The names a Smockron domain accepts; the first is the default."""

BY_NUMBER: Final = {int(row.cluster): row.cluster for row in TABLE if row.cluster is not None}
"""The cluster's algorithms by wire number."""


def name_of(algorithm: Algorithm) -> str:
    """The vocabulary's word for a cluster algorithm."""
    return next(row.name for row in TABLE if row.cluster == algorithm)


def stored_as(name: str) -> str:
    """The master's name for the states of a domain algorithm (see ``states``)."""
    states = BY_NAME[name].states
    assert states is not None, name
    return states
