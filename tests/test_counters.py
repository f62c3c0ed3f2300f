"""Every component's counters read out the same way and stay slot-only (hot path)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest

from smockron.cluster.envoy.service import EnvoyStats
from smockron.cluster.envoy.stats import LimitStats
from smockron.counters import CounterSet
from smockron.daemons.dthrottle import DThrottleStats
from smockron.daemons.jarl import JarlStats
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


@dataclass(slots=True)
class WithReasons(CounterSet):
    seen: int = 0
    malformed: Counter[str] = field(default_factory=Counter)


def test_a_by_reason_field_reads_out_as_its_total() -> None:
    c = WithReasons()
    c.malformed["short"] += 2
    c.malformed["bad_version"] += 1
    assert c.as_dict() == {"seen": 0, "malformed": 3}


ALL = [Example, WithReasons, EnvoyStats, LimitStats, Counters, DomainStats, DThrottleStats]


@pytest.mark.parametrize("cls", [*ALL, JarlStats])
def test_counter_classes_have_no_instance_dict(cls: type[CounterSet]) -> None:
    c = cls()
    assert not hasattr(c, "__dict__")
    assert set(c.as_dict().values()) == {0}
    with pytest.raises(AttributeError):
        c.not_a_counter = 1  # type: ignore[attr-defined]
