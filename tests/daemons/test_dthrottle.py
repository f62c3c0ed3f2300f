"""DThrottle's bucket table, rules, whitelist and reports, exactly, with an injected clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smockron.daemons.dthrottle import algorithm
from smockron.daemons.dthrottle.algorithm import NO, OK, PrefixRule, RuleTable, Throttle, whitelist
from smockron.errors import ConfigError

C = b"C"


def throttle(*rules: PrefixRule, burst: int = 10, rate: float = 1.0) -> Throttle:
    return Throttle(RuleTable(PrefixRule(b"", burst, rate), rules))


def oks(t: Throttle, tag: bytes, n: int, now: float) -> int:
    return sum(t.allow(tag, now) for _ in range(n))


def test_seed_worked_example_step_by_step() -> None:
    """Onlines A and B, burst 10, rate 1/s, reports every 5 s (dthrottle-readme.txt).

    The seed's table counts whole tokens: its bursts at t=0.1 and t=0.2 gain no refill.
    With continuous refill 0.1 s is worth 0.1 token, so the bursts happen at t=0 here
    (as fast as possible: no clock time passes) and every later value in the table is
    then exact.
    """
    a, b = throttle(), throttle()
    assert a.balance(C, 0.0) == b.balance(C, 0.0) == 10
    # t=0.1: 17 requests, 9 to A and 8 to B, none throttled
    assert oks(a, C, 9, 0.0) == 9 and oks(b, C, 8, 0.0) == 8
    assert a.balance(C, 0.0) == 1 and b.balance(C, 0.0) == 2
    # t=0.2: two more, both to A: the first is served, the second refused
    assert [a.allow(C, 0.0), a.allow(C, 0.0)] == [True, False]
    assert a.balance(C, 0.0) == 0 and b.balance(C, 0.0) == 2
    # t=5: each reports what it served; C's line: A 10, B 8
    report_a, report_b = a.take_report(5.0), b.take_report(5.0)
    assert report_a == {C: 10} and report_b == {C: 8}
    a.apply_report(report_b, 5.0)
    b.apply_report(report_a, 5.0)
    # t=5.1 in the seed ("-8+5" on both): the buckets agree
    assert a.balance(C, 5.0) == pytest.approx(-3) and b.balance(C, 5.0) == pytest.approx(-3)
    # t=5.2: two further requests, denied by both
    assert a.answer([C], 5.2) + b.answer([C], 5.2) == NO + NO
    # t=6, 7, 8: C backs off while its bucket refills
    for t, expected in ((6.0, -2), (7.0, -1), (8.0, 0)):
        assert a.balance(C, t) == pytest.approx(expected)
        assert b.balance(C, t) == pytest.approx(expected)
        assert not a.allow(C, t) and not b.allow(C, t)
    # t=9: one token (the seed's whole-token table; the rule "OK while tokens > 0"
    # would already serve a request between t=8 and t=9, e.g. at t=8.5 with 0.5 tokens)
    assert a.balance(C, 8.5) == pytest.approx(0.5)
    assert a.balance(C, 9.0) == b.balance(C, 9.0) == pytest.approx(1)
    # C may make one more request on each online, then waits again
    assert a.answer([C, C], 9.0) == OK + NO
    assert b.answer([C, C], 9.0) == OK + NO


def test_a_no_costs_nothing_and_balance_refills_to_burst() -> None:
    t = throttle(burst=2, rate=0.5)
    assert t.answer([b"x"] * 5, 0.0) == OK + OK + NO + NO + NO
    assert t.balance(b"x", 1.0) == pytest.approx(0.5)
    assert not t.allow(b"x", 1.0)  # half a token is not one
    assert t.allow(b"x", 2.0)  # a whole token again: OK, back to 0
    assert not t.allow(b"x", 2.0)
    assert t.balance(b"x", 100.0) == 2


def test_report_counts_only_served_requests_and_resets() -> None:
    t = throttle(burst=3)
    t.answer([b"a"] * 5 + [b"b"], 0.0)
    assert t.take_report(0.0) == {b"a": 3, b"b": 1}
    assert t.take_report(0.0) == {}


def test_full_buckets_are_forgotten_at_the_next_report() -> None:
    t = throttle(burst=2, rate=1.0)
    t.answer([b"a", b"b", b"b"], 0.0)
    t.take_report(0.5)  # a: 1.5, b: 0.5 -> both kept
    assert set(t.buckets) == {b"a", b"b"}
    t.take_report(1.0)  # a full again
    assert set(t.buckets) == {b"b"}
    t.take_report(2.0)
    assert t.buckets == {}


def test_a_large_table_is_swept_a_slice_per_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """A report looks at ``SWEEP_SLICE`` buckets at most (a report pauses the loop): a
    larger table loses its full buckets over several reports, never one that is not
    full, and tags that arrive meanwhile neither stop the pass nor are lost."""
    monkeypatch.setattr(algorithm, "SWEEP_SLICE", 4)
    t = throttle(burst=2, rate=1.0)
    t.answer([b"f%d" % i for i in range(10)], 0.0)  # full again at t=1
    t.answer([b"k%d" % i for i in range(5)] * 2, 0.0)  # empty: full again at t=2
    t.take_report(0.0)  # looks at all it made (none full yet): from now on, slices
    reports = 0
    while any(tag.startswith(b"f") for tag in t.buckets):
        before = len(t.buckets)
        t.take_report(1.5)
        reports += 1
        assert before - len(t.buckets) <= 4
        assert {b"k%d" % i for i in range(5)} <= set(t.buckets)  # not full: kept
        t.answer([b"n%d" % reports], 1.5)  # a newcomer each report, not full
        assert reports < 20, sorted(t.buckets)
    assert reports >= 3  # 10 full buckets, 4 looked at per report
    assert all(t.allow(b"f%d" % i, 1.5) for i in range(10))  # forgotten: start full
    while t.buckets:  # everything full again by t=10: all go, a slice at a time
        t.take_report(10.0)
        reports += 1
        assert reports < 40, sorted(t.buckets)


def test_a_flood_of_new_tags_is_swept_as_fast_as_it_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More new tags between two reports than a slice: the report looks at twice as many
    as were made, so the table stays bounded by the last reports' tags (a fixed slice
    would fall behind and grow without end)."""
    monkeypatch.setattr(algorithm, "SWEEP_SLICE", 4)
    t = throttle(burst=2, rate=1.0)
    made = 0
    sizes = []
    for report in range(60):
        now = float(report)
        for _ in range(10):  # each takes one of two tokens: full again 1 s later
            assert t.allow(b"t%d" % made, now)
            made += 1
        t.take_report(now + 0.5)
        sizes.append(len(t.buckets))
    assert max(sizes) <= 20, sizes


def test_peer_reports_create_buckets_and_go_negative() -> None:
    t = throttle(burst=10)
    assert t.apply_report({b"new": 25, b"x": 1}, 0.0) == 2
    assert t.balance(b"new", 0.0) == -15
    assert not t.allow(b"new", 15.5)  # half a token
    assert t.allow(b"new", 16.0)  # one whole token, 16 s later


def test_longest_prefix_rule_wins_and_default_is_empty_prefix() -> None:
    t = throttle(PrefixRule(b"api:", 2, 1.0), PrefixRule(b"api:vip:", 5, 1.0), burst=1)
    assert oks(t, b"api:bob", 10, 0.0) == 2
    assert oks(t, b"api:vip:ann", 10, 0.0) == 5
    assert oks(t, b"web:x", 10, 0.0) == 1
    assert t.rules.rule_for(b"api").prefix == b""


def test_whitelisted_prefixes_are_always_ok_and_never_reported() -> None:
    t = throttle(whitelist(b"10."), PrefixRule(b"10.0.0.", 1, 1.0), burst=1)
    assert oks(t, b"10.1.2.3", 1000, 0.0) == 1000
    assert oks(t, b"10.0.0.9", 5, 0.0) == 1  # a longer rule beats the whitelist
    assert t.apply_report({b"10.1.2.3": 50}, 0.0) == 0
    assert t.allow(b"10.1.2.3", 0.0)
    assert t.take_report(0.0) == {b"10.0.0.9": 1}
    assert t.balance(b"10.9.9.9", 0.0) is None


def test_tags_are_opaque_bytes() -> None:
    t = throttle(burst=1)
    weird = [b"", b"\x00\xff", b"caf\xc3\xa9", b"a b\r", b"\x80" * 200]
    assert t.answer(weird, 0.0) == OK * 5
    assert t.answer(weird, 0.0) == NO * 5


@pytest.mark.parametrize(
    "rule",
    [
        lambda: PrefixRule(b"x", 0, 1.0),
        lambda: PrefixRule(b"x", 1, 0.0),
        lambda: PrefixRule(b"x", 1, -1.0),
    ],
)
def test_bad_rules_are_refused(rule: object) -> None:
    with pytest.raises(ConfigError, match="prefix b'x'"):
        rule()  # type: ignore[operator]


def test_duplicate_prefixes_are_refused() -> None:
    with pytest.raises(ConfigError, match="configured twice"):
        RuleTable(PrefixRule(b""), [PrefixRule(b"a"), whitelist(b"a")])
    with pytest.raises(ConfigError, match="empty prefix"):
        RuleTable(PrefixRule(b"a"))


events = st.lists(
    st.tuples(
        st.floats(0, 3, allow_nan=False),  # time step
        st.sampled_from([b"a", b"b", b"api:x", b"ok:y"]),  # tag
        st.integers(0, 3),  # 0: query, 1: report, 2: peer hits, 3: query
        st.integers(1, 12),  # peer hit count
    ),
    max_size=80,
)


@given(events)
def test_forgetting_full_buckets_never_changes_an_answer(
    steps: list[tuple[float, bytes, int, int]],
) -> None:
    """Pruning at report time is invisible, and reports count exactly the OKs."""
    rules = (PrefixRule(b"api:", 3, 0.5), whitelist(b"ok:"))
    pruned, kept = throttle(*rules, burst=4, rate=2.0), throttle(*rules, burst=4, rate=2.0)
    now = 0.0
    served = reported = 0
    for step, tag, action, hits in steps:
        now += step
        if action == 1:
            reported += sum(pruned.take_report(now).values())
            kept.hits.clear()
        elif action == 2:
            assert pruned.apply_report({tag: hits}, now) == kept.apply_report({tag: hits}, now)
        else:
            answer = pruned.allow(tag, now)
            assert answer == kept.allow(tag, now)
            served += answer and not tag.startswith(b"ok:")
    assert reported + sum(pruned.hits.values()) == served


def test_at_max_entries_the_fullest_old_buckets_are_evicted_first() -> None:
    """Among the oldest, a full bucket goes before one in debt: evicting it changes no
    answer, while evicting the drained one would hand its client a new burst."""
    t = Throttle(RuleTable(PrefixRule(b"", 3, 0.001)), max_entries=64)
    assert oks(t, b"abuser", 5, 0.0) == 3  # drained, first in the table
    for i in range(63):
        t.allow(b"once-%d" % i, 0.0)  # each 2 of 3 tokens
    t.apply_report({b"abuser": 10}, 0.0)  # and in debt from a peer's report
    t.allow(b"new", 0.0)  # the 65th tag: room is made
    assert len(t.buckets) <= 64 and t.evicted >= 1
    assert b"abuser" in t.buckets and t.balance(b"abuser", 0.0) == -10
    assert oks(t, b"abuser", 1, 1.0) == 0


def test_max_entries_bounds_the_table_under_a_flood() -> None:
    t = Throttle(RuleTable(PrefixRule(b"", 3, 0.001)), max_entries=1000)
    for i in range(50_000):
        assert t.allow(b"tag-%d" % i, i * 0.0001)
        assert len(t.buckets) <= 1000
    assert t.evicted == 50_000 - len(t.buckets)
    with pytest.raises(ConfigError):
        Throttle(RuleTable(PrefixRule(b"", 3, 1.0)), max_entries=0)
