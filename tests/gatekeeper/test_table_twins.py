"""Applying DELAY_UNTILs: the compiled loop (``_tablefast``) and its pure-Python twin
leave the same table, first lines and counts, and return the same, for any run; and a
sweep's compiled and Python twins forget the same keys."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smockron.core.rules import parse_rule_spec
from smockron.gatekeeper._decider import Decider
from smockron.gatekeeper._firstline import Line
from smockron.gatekeeper._table import (
    DelayUntil,
    Hold,
    Key,
    UpdateRun,
    passed_compiled,
    passed_python,
    update_run_compiled,
    update_run_python,
)
from tests.support import twins

TWINS = twins(update_run_python, update_run_compiled, "_tablefast")

NOW = 1_000
DOMAINS = [b"a", b"b", b"c"]  # a: one rule, b: several rules, c: none
IDENTIFIERS = [b"x", b"y", b"z", b"w"]
records = st.lists(
    st.tuples(st.sampled_from(DOMAINS), st.sampled_from(IDENTIFIERS), st.integers(0, 3_000)),
    max_size=40,
)
tables = st.dictionaries(
    st.tuples(st.sampled_from(DOMAINS), st.sampled_from([b"x", b"y"])),
    st.integers(0, 3_000),
    max_size=6,
)
locals_ = st.dictionaries(
    st.sampled_from([b"x", b"y", b"z"]), st.floats(0, 5_000, allow_nan=False), max_size=3
)


def run_all(
    update: UpdateRun,
    entries: dict[Key, int],
    recs: list[DelayUntil],
    room: int,
    holds: dict[bytes, Hold] | None,
    start: int,
) -> tuple[object, ...]:
    counts: dict[bytes, int] = {}
    out = update(entries, recs, start, NOW, 1_500, room, holds, counts)
    return out, entries, holds, counts


@pytest.mark.skipif(update_run_compiled is None, reason="_tablefast not built")
@settings(max_examples=400, deadline=None)
@given(
    recs=records,
    entries=tables,
    local=locals_,
    room=st.integers(0, 8),
    cap=st.integers(0, 4),
    start=st.integers(0, 5),
    with_holds=st.booleans(),
)
def test_compiled_and_python_agree(
    recs: list[DelayUntil],
    entries: dict[Key, int],
    local: dict[bytes, float],
    room: int,
    cap: int,
    start: int,
    with_holds: bool,
) -> None:
    holds: dict[bytes, Hold] | None = None
    if with_holds:
        holds = {b"a": (250.5, local, cap), b"b": None}
    assert update_run_compiled is not None
    start = min(start, len(recs))
    got = run_all(update_run_compiled, dict(entries), recs, room, copy.deepcopy(holds), start)
    want = run_all(update_run_python, dict(entries), recs, room, copy.deepcopy(holds), start)
    assert got == want


@pytest.mark.parametrize("update", TWINS)
def test_a_run_stops_where_the_table_needs_room(update: UpdateRun) -> None:
    entries: dict[Key, int] = {(b"a", b"x"): 2_000}
    recs: list[DelayUntil] = [
        (b"a", b"x", 2_500),
        (b"a", b"x", 2_100),
        (b"a", b"n", 900),
        (b"a", b"y", 3_000),
        (b"a", b"z", 9_000),
    ]
    counts: dict[bytes, int] = {}
    stop, refused, moved, unheld = update(entries, recs, 0, NOW, 5_000, 1, None, counts)
    assert (stop, refused, moved, unheld) == (3, 0, 1, [recs[0]])  # y needs a new entry
    assert entries == {(b"a", b"x"): 2_500} and counts == {b"a": 3}
    stop, refused, moved, unheld = update(entries, recs, 3, NOW, 5_000, 5, None, counts)
    assert (stop, refused, moved, unheld) == (5, 1, 1, [recs[3]])  # z: too far ahead
    assert counts == {b"a": 5}


@pytest.mark.parametrize("update", TWINS)
def test_holds_keep_a_first_line_behind_the_master(update: UpdateRun) -> None:
    local = {b"x": 10_000.0, b"y": 1_500.0}
    holds: dict[bytes, Hold] = {b"a": (100.0, local, 3), b"b": None}
    recs: list[DelayUntil] = [
        (d, i, 2_000)
        for d, i in (
            (b"a", b"x"),
            (b"a", b"y"),
            (b"a", b"z"),
            (b"a", b"w"),
            (b"b", b"x"),
            (b"c", b"x"),
        )
    ]
    entries: dict[Key, int] = {}
    stop, refused, moved, unheld = update(entries, recs, 0, NOW, 5_000, 100, holds, None)
    assert (stop, refused, moved) == (6, 0, 6)
    assert unheld == [(b"b", b"x", 2_000)]  # several rules: the caller holds them
    assert local == {b"x": 10_000.0, b"y": 2_100.0, b"z": 2_100.0}  # w: no room (cap 3)


@pytest.mark.parametrize("update", TWINS)
def test_decider_applies_a_resync_through_either_twin(
    update: UpdateRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full table sweeps, then evicts, between runs; first lines of one and of several
    rules are held to the master's times."""
    monkeypatch.setattr("smockron.gatekeeper._table.update_run", update)
    decider = Decider(max_entries=3_000)

    one = Line.of("history", [parse_rule_spec("a:1/s:1")[1]])
    two = Line.of("history", [parse_rule_spec("b:1/s:1")[1], parse_rule_spec("b:10/m:10")[1]])
    decider.set_line(b"a", one)
    decider.set_line(b"b", two)
    recs: list[DelayUntil] = [
        (d, b"%d" % i, NOW + 10 + i) for i in range(2_000) for d in (b"a", b"b")
    ]
    counts: dict[bytes, int] = {}
    assert decider.control_many(recs, NOW, counts) == 4_000
    assert counts == {b"a": 2_000, b"b": 2_000}
    assert len(decider.table) <= 3_000 and decider.table.evicted > 0
    assert decider.table.until(b"a", b"1999", NOW) == NOW + 2_009  # the latest are kept
    assert decider.decide(b"a", b"1999", NOW).until_ms == NOW + 2_009
    assert decider.decide(b"b", b"1999", NOW).until_ms == NOW + 2_009


time_ = st.one_of(
    st.integers(-(2**70), 2**70),  # beyond a long long and a double's exact integers
    st.integers(0, 3_000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(0, 3_000),
)
times = st.one_of(  # a time, or a first line's times under several rules (its latest)
    time_,
    st.tuples(time_),
    st.lists(st.floats(0, 3_000), min_size=1, max_size=4).map(tuple),
    st.lists(
        st.one_of(st.floats(allow_nan=True), st.integers(0, 3_000)), min_size=1, max_size=4
    ).map(tuple),
)


@pytest.mark.skipif(passed_compiled is None, reason="_tablefast not built")
@settings(max_examples=500, deadline=None)
@given(
    table=st.dictionaries(st.binary(max_size=3), times, max_size=12),
    now=st.one_of(st.integers(-(2**62), 2**62), st.integers(0, 3_000)),
)
def test_compiled_and_python_sweeps_agree(table: dict[bytes, Any], now: int) -> None:
    """What a sweep forgets, compiled and in Python: the same keys in the same order,
    for int and float times, huge ones, NaN and infinities included, and for tuples of
    them (their latest, as ``max`` picks it)."""
    assert passed_compiled is not None
    assert passed_compiled(table, now) == passed_python(table, now)


@pytest.mark.skipif(passed_compiled is None, reason="_tablefast not built")
def test_compiled_sweep_refuses_what_is_not_a_dict_or_a_time() -> None:
    assert passed_compiled is not None
    with pytest.raises(TypeError):
        passed_compiled([(b"a", 1)], 0)  # type: ignore[arg-type]
    for twin in (passed_compiled, passed_python):
        with pytest.raises(ValueError):
            twin({b"a": ()}, 0)
        with pytest.raises(TypeError):
            twin({b"a": "soon"}, 0)  # type: ignore[dict-item]
