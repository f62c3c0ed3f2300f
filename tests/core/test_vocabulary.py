"""One table of algorithm names: the master, the gatekeepers and the cluster agree on it."""

from __future__ import annotations

import pytest

from smockron.cluster.convert import algorithm_from_int
from smockron.core.rules import Rule
from smockron.core.vocabulary import ALGORITHMS, TABLE, Algorithm, name_of, stored_as
from smockron.errors import ConfigError
from smockron.master.domains import DomainPolicy


def test_every_cluster_algorithm_has_exactly_one_name() -> None:
    named = [row.cluster for row in TABLE if row.cluster is not None]
    assert sorted(named) == sorted(Algorithm)
    assert len({row.name for row in TABLE}) == len(TABLE)
    assert name_of(Algorithm.SMOCKRON_HISTORY) == "history-literal"
    for algorithm in Algorithm:
        assert algorithm_from_int(int(algorithm)) is algorithm
    with pytest.raises(ValueError, match="invalid rate limit algorithm"):
        algorithm_from_int(len(Algorithm))


def test_the_master_runs_the_domain_names_and_only_those() -> None:
    assert ALGORITHMS == ("history", "gcra", "history-literal")
    for row in TABLE:
        if row.domain:
            assert DomainPolicy((Rule(1.0, 1),), row.name).stored_as == stored_as(row.name)
        else:
            with pytest.raises(ConfigError, match=row.name):
                DomainPolicy((Rule(1.0, 1),), row.name)
    assert stored_as("history-literal") == stored_as("history")  # a switch keeps states
