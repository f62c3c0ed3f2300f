"""Shard ownership over a fleet of masters: balanced, complete, stable."""

from __future__ import annotations

from collections import Counter

import pytest

from smockron.core.shards import SHARDS, owned, owners


def names(n: int) -> list[str]:
    return [f"tcp://10.0.0.{i}:5555" for i in range(n)]


def loads(table: dict[int, tuple[str, ...]]) -> Counter[str]:
    return Counter(name for holders in table.values() for name in holders)


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32])
def test_one_replica_splits_the_shards_evenly(n: int) -> None:
    """The drain of one domain over N masters is capped by the busiest: with one replica
    and N dividing 64, every master holds exactly 64/N shards."""
    assert set(loads(owners(names(n), 1)).values()) == {SHARDS // n}


@pytest.mark.parametrize("n", range(1, 20))
@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_every_shard_has_its_replicas_and_no_master_far_over_its_share(
    n: int, replicas: int
) -> None:
    table = owners(names(n), replicas)
    count = min(n, replicas)
    assert all(len(set(h)) == len(h) == count for h in table.values())
    fair = -(-SHARDS * count // n)
    assert max(loads(table).values()) <= fair + 3
    assert sum(loads(table).values()) == SHARDS * count


def test_the_table_does_not_depend_on_the_order_of_the_list() -> None:
    fleet = names(5)
    assert owners(fleet, 2) == owners(list(reversed(fleet)), 2)
    assert owned(fleet[0], fleet[1:], 2) == owned(fleet[0], list(reversed(fleet)), 2)


@pytest.mark.parametrize("n", [3, 5, 8])
def test_a_master_joining_moves_a_bounded_part_of_the_table(n: int) -> None:
    """A plain ring moves exactly the newcomer's share; the load bound moves some more
    (shards pushed past a full member), never the whole table."""
    before = owners(names(n), 2)
    after = owners([*names(n), "tcp://10.0.1.1:5555"], 2)
    moved = sum(len(set(after[s]) - set(before[s])) for s in range(SHARDS))
    share = SHARDS * 2 / (n + 1)
    assert share * 0.5 <= moved <= share * 2.5
