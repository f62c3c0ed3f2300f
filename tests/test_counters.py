"""Every component's counters read out the same way and stay slot-only (hot path)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from smockron.cluster.envoy.service import EnvoyStats
from smockron.counters import CounterSet
from smockron.gatekeeper._decider import Counters
from smockron.master.stats import DomainStats


@dataclass(slots=True)
class Example(CounterSet):
    first: int = 0
    second: int = 0


def test_as_dict_is_a_snapshot_in_declaration_order() -> None:
    c = Example()
    c.second += 2
    snapshot = c.as_dict()
    c.first += 1
    assert list(snapshot.items()) == [("first", 0), ("second", 2)]
    assert c.as_dict() == {"first": 1, "second": 2}


@pytest.mark.parametrize("cls", [Example, EnvoyStats, Counters, DomainStats])
def test_counter_classes_have_no_instance_dict(cls: type[CounterSet]) -> None:
    c = cls()
    assert not hasattr(c, "__dict__")
    assert set(c.as_dict().values()) == {0}
    with pytest.raises(AttributeError):
        c.not_a_counter = 1  # type: ignore[attr-defined]
