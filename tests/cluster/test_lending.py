"""The owner's GLOBAL lending ledger, exactly, with an injected clock."""

from __future__ import annotations

import pytest

from smockron.cluster.lending import OWNER, Ledger


def test_equal_shares_before_any_demand() -> None:
    ledger = Ledger(hold_ms=1000)
    # 90 left, three nodes, no demand seen: ceil(90 / 3) for the first node to ask
    assert ledger.lend("k", "a", 90, 60_000, 0, limit=100, nodes=3).amount == 30
    # the second gets a third of what is not lent to the first: ceil(60 / 3)
    assert ledger.lend("k", "b", 90, 60_000, 0, limit=100, nodes=3).amount == 20
    assert ledger.reserved("k", 0) == 50
    assert ledger.reserved("k", 0, but="a") == 20


def test_a_new_loan_replaces_the_old_one() -> None:
    ledger = Ledger(hold_ms=1000)
    ledger.lend("k", "a", 90, 60_000, 0, limit=100, nodes=3)
    assert ledger.lend("k", "a", 60, 60_000, 10, limit=100, nodes=3).amount == 20
    assert ledger.reserved("k", 10) == 20


def test_shares_follow_demand_with_a_prior_of_a_tenth_of_the_limit() -> None:
    ledger = Ledger(hold_ms=1000)
    ledger.ask("k", "a", 30, now=0)
    ledger.ask("k", OWNER, 10, now=0)
    # a: (30 + 10) / (40 + 3 * 10) of 70
    assert ledger.share("k", "a", 0, prior=10, nodes=3) == pytest.approx(40 / 70)
    assert ledger.lend("k", "a", 70, 60_000, 0, limit=100, nodes=3).amount == 40
    # a node with no demand yet still gets the prior's share
    assert ledger.share("k", "b", 0, prior=10, nodes=3) == pytest.approx(10 / 70)


def test_demand_decays_with_its_half_life() -> None:
    ledger = Ledger(hold_ms=1000, half_life_ms=100)
    ledger.ask("k", "a", 40, now=0)
    ledger.ask("k", "a", 0, now=200)  # 40 halved twice
    ledger.ask("k", "b", 10, now=200)
    assert ledger.share("k", "a", 200, prior=1, nodes=2) == pytest.approx(11 / 22)


def test_loans_lapse_after_the_hold_or_at_the_window_end() -> None:
    ledger = Ledger(hold_ms=300)
    ledger.lend("k", "a", 90, 60_000, 0, limit=100, nodes=3)
    ledger.lend("k", "b", 90, 200, 0, limit=100, nodes=3)
    assert ledger.reserved("k", 199) == 50
    assert ledger.reserved("k", 200) == 30  # b's window ended
    assert ledger.reserved("k", 300) == 0  # a's loan was held 300 ms


def test_nothing_to_lend_when_the_others_hold_it_all() -> None:
    ledger = Ledger(hold_ms=1000)
    assert ledger.lend("k", "a", 3, 60_000, 0, limit=100, nodes=1).amount == 3
    assert ledger.lend("k", "b", 3, 60_000, 0, limit=100, nodes=2).amount == 0
    assert ledger.lend("k", "c", -1, 60_000, 0, limit=100, nodes=2).amount == 0


def test_grants_are_numbered_in_order_from_the_clock() -> None:
    ledger = Ledger(hold_ms=1000)
    first = ledger.lend("k", "a", 90, 60_000, 5, limit=100, nodes=3)
    second = ledger.release("k", "a", 5)
    third = ledger.lend("k", "b", 90, 60_000, 4, limit=100, nodes=3)
    assert (first.number, second, third.number) == (5000, 5001, 5002)
    assert ledger.lend("k", "a", 90, 60_000, 7, limit=100, nodes=3).number == 7000


def test_release_holds_nothing_for_the_node() -> None:
    ledger = Ledger(hold_ms=1000)
    ledger.lend("k", "a", 90, 60_000, 0, limit=100, nodes=3)
    ledger.release("k", "a", 1)
    assert ledger.reserved("k", 1) == 0


def test_bounded_keys() -> None:
    ledger = Ledger(hold_ms=1000, max_keys=2)
    for key in ("x", "y", "z"):
        ledger.lend(key, "a", 10, 60_000, 0, limit=10, nodes=1)
    assert len(ledger) == 2 and ledger.reserved("x", 0) == 0 and ledger.reserved("z", 0) == 10
    with pytest.raises(ValueError, match="hold_ms"):
        Ledger(hold_ms=0)
