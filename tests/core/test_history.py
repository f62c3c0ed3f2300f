"""The seed's history rule: exact examples, and the capped history against an oracle."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from smockron.core.history import (
    expires_at,
    next_allowed,
    record,
    recorded,
    rule_verdict,
    served_at,
    verdict_of,
    verdicts_after,
)
from smockron.core.rules import Rule


def test_burst_then_delay() -> None:
    rule = Rule(1.0, 3)  # 1/s, burst 3: window 3 s
    history: list[float] = []
    for _ in range(2):
        record(history, 0.0, rule)
        assert next_allowed(history, 0.0, rule) is None
    record(history, 0.0, rule)
    assert next_allowed(history, 0.0, rule) == 1000.0


def test_steady_state_follows_rate() -> None:
    rule = Rule(1.0, 3)
    history: list[float] = [0.0, 0.0, 0.0]
    # a request delayed to t=1000 is recorded with its delayed timestamp
    record(history, 1000.0, rule)
    assert history == [0.0, 0.0, 1000.0]
    assert next_allowed(history, 1000.0, rule) == 2000.0
    # once the window has passed, requests are acceptable again
    assert next_allowed(history, 3000.0, rule) is None


def test_start_is_latest_of_now_and_last_timestamp() -> None:
    rule = Rule(2.0, 2)  # interval 500 ms, window 1000 ms
    history = [100.0, 900.0]
    assert next_allowed(history, 950.0, rule) == 1450.0  # start = now (950) > last ts 900
    history = [100.0, 1500.0]  # a delayed timestamp in the future
    assert next_allowed(history, 950.0, rule) == 2000.0


def test_window_boundary_is_exclusive() -> None:
    rule = Rule(1.0, 2)  # window 2000 ms
    assert next_allowed([0.0, 0.0], 2000.0, rule) is None
    assert next_allowed([0.0, 0.0], 1999.0, rule) == 2999.0


def test_history_never_exceeds_burst() -> None:
    rule = Rule(10.0, 4)
    history: list[float] = []
    for i in range(100):
        record(history, float(i), rule)
        assert len(history) <= 4
    assert history == [96.0, 97.0, 98.0, 99.0]
    assert expires_at(history, rule) == 99.0 + 400.0


def oracle(all_timestamps: list[float], now: float, rule: Rule) -> float | None:
    """The rule over the whole, uncapped history: what the seed says the cap preserves."""
    window = rule.burst / rule.rate * 1000.0
    recent = [ts for ts in all_timestamps if ts > now - window]
    if len(recent) < rule.burst:
        return None
    return max(now, all_timestamps[-1]) + 1000.0 / rule.rate


@settings(max_examples=300)
@given(
    rate=st.sampled_from([0.5, 1.0, 3.0, 10.0, 100.0]),
    burst=st.integers(1, 12),
    gaps=st.lists(st.integers(0, 3000), min_size=1, max_size=60),
    lag=st.integers(0, 5000),
)
def test_capped_history_matches_full_history(
    rate: float, burst: int, gaps: list[int], lag: int
) -> None:
    """For timestamps in order, keeping only ``burst`` of them decides exactly the same."""
    rule = Rule(rate, burst)
    capped: list[float] = []
    full: list[float] = []
    ts = 1_000_000.0
    for gap in gaps:
        ts += gap
        record(capped, ts, rule)
        full.append(ts)
        for now in (ts, ts + lag):
            assert next_allowed(capped, now, rule) == oracle(full, now, rule)


@settings(max_examples=200)
@given(rate=st.sampled_from([1.0, 5.0, 20.0]), burst=st.integers(1, 10), n=st.integers(1, 200))
def test_obedient_client_holds_to_rule(rate: float, burst: int, n: int) -> None:
    """A client that always waits for DELAY_UNTIL gets burst + rate x T requests, no more."""
    rule = Rule(rate, burst)
    history: list[float] = []
    now = 0.0
    allowed_at: float | None = None
    times = []
    for _ in range(n):
        if allowed_at is not None and allowed_at > now:
            now = allowed_at
        times.append(now)
        record(history, now, rule)
        allowed_at = next_allowed(history, now, rule)
    span_s = (times[-1] - times[0]) / 1000.0
    assert len(times) <= burst + rate * span_s + 1e-6 + 1
    assert len(times) >= min(n, burst)


def _states(rules: list[Rule], gaps: list[int]) -> list[tuple[float, ...]]:
    """Each rule's stored history after requests ``gaps`` apart, as the master keeps it."""
    states: list[tuple[float, ...]] = [() for _ in rules]
    ts = 1_000_000.0
    for gap in gaps:
        ts += gap
        states = [recorded(state, ts, rule) for rule, state in zip(rules, states, strict=True)]
    return states


_RULES = st.lists(
    st.builds(Rule, st.sampled_from([0.5, 1.0, 3.0, 10.0, 100.0]), st.integers(1, 8)),
    min_size=1,
    max_size=3,
)


@settings(max_examples=300)
@given(rules=_RULES, gaps=st.lists(st.integers(0, 3000), max_size=30))
def test_verdict_is_what_the_rule_published_at_the_newest_entry(
    rules: list[Rule], gaps: list[int]
) -> None:
    """The DELAY_UNTIL a RESYNC repeats is the one the rule computed when it recorded the
    newest entry: ``next_allowed`` at that time, the latest over the rules."""
    states = _states(rules, gaps)
    expected: float | None = None
    for rule, state in zip(rules, states, strict=True):
        got = rule_verdict(rule, state, gcra=False)
        assert got == (next_allowed(state, state[-1], rule) if state else None)
        if got is not None and (expected is None or got > expected):
            expected = got
    assert verdict_of(rules, states, gcra=False) == expected


@settings(max_examples=300)
@given(
    rules=_RULES,
    gaps=st.lists(st.integers(0, 3000), max_size=30),
    late=st.integers(-3000, 3000),
    ahead=st.integers(0, 10_000),
)
def test_served_at_is_the_published_verdict_capped(
    rules: list[Rule], gaps: list[int], late: int, ahead: int
) -> None:
    """A request arriving at ``ts`` is served no earlier than the verdict it should have
    obeyed, and never more than ``ahead`` after ``ts``."""
    states = _states(rules, gaps)
    ts = 1_000_000.0 + sum(gaps) + late
    verdict = verdict_of(rules, states, gcra=False)
    due = ts if verdict is None or verdict < ts else verdict
    assert served_at(rules, states, ts, float(ahead)) == min(due, ts + ahead)


@given(
    values=st.lists(st.one_of(st.just(()), st.tuples(st.integers(0, 5000).map(float)))),
    now=st.integers(0, 5000),
)
def test_verdicts_after_lists_the_future_gcra_values(
    values: list[tuple[float, ...]], now: int
) -> None:
    rule = Rule(1.0, 2)
    pairs = [(b"k%d" % i, v) for i, v in enumerate(values)]
    want = [(k, math.ceil(v[0])) for k, v in pairs if v and v[0] > now]
    assert verdicts_after(rule, pairs, True, float(now)) == want
    assert all(verdict_of([rule], [v], True) == (v[0] if v else None) for _k, v in pairs)
