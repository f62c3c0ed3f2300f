"""The engine with an injected clock: exact DELAY_UNTIL values, counters, garbage."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smockron.core.rules import Rule
from smockron.errors import ConfigError
from smockron.master.domains import DomainPolicy
from smockron.master.engine import Engine
from smockron.master.stores.memory import MemoryStore
from smockron.wire.codec import ACCEPTED, DELAYED, REJECTED, decode_control, encode_accounting

T0 = 1_700_000_000_000  # a realistic "now" in ms


def acc(
    ident: bytes, ts: int, status: bytes = ACCEPTED, domain: str = "api", delayed: int | None = None
) -> list[bytes]:
    return encode_accounting(domain, status, ident, ts, delayed)


def engine(**policies: DomainPolicy) -> Engine:
    return Engine(policies, MemoryStore())


def untils(out: list[list[bytes]]) -> list[tuple[bytes, bytes, int]]:
    return [(c.domain, c.identifier, c.until_ms) for c in map(decode_control, out)]


def test_burst_then_delay_until_history() -> None:
    eng = engine(api=DomainPolicy((Rule(1.0, 3),)))  # 1/s, burst 3
    assert eng.process([acc(b"a", T0), acc(b"a", T0)], T0) == []
    out = eng.process([acc(b"a", T0)], T0)
    assert untils(out) == [(b"api", b"a", T0 + 1000)]
    # the gatekeeper delays the next one to T0+1000: history now ends there
    out = eng.process([acc(b"a", T0 + 10, DELAYED, delayed=T0 + 1000)], T0 + 10)
    assert untils(out) == [(b"api", b"a", T0 + 2000)]
    s = eng.stats.domains["api"]
    assert (s.accepted, s.delayed, s.published) == (3, 1, 2)
    # another identifier is untouched
    assert eng.process([acc(b"b", T0 + 20)], T0 + 20) == []


def test_history_window_passes() -> None:
    eng = engine(api=DomainPolicy((Rule(2.0, 2),)))  # interval 500, window 1000
    assert untils(eng.process([acc(b"x", T0), acc(b"x", T0 + 100)], T0 + 100)) == [
        (b"api", b"x", T0 + 600)
    ]
    # 1001 ms after the first, only one request is within the window
    assert eng.process([acc(b"x", T0 + 1101)], T0 + 1101) == []


def test_several_rules_latest_wins_literal() -> None:
    # 10/s burst 2 and 1/s burst 3: after 3 requests the second rule says +1000
    eng = engine(api=DomainPolicy((Rule(10.0, 2), Rule(1.0, 3)), "history-literal"))
    out = eng.process([acc(b"a", T0), acc(b"a", T0), acc(b"a", T0)], T0)
    assert untils(out) == [(b"api", b"a", T0 + 100), (b"api", b"a", T0 + 1000)]


def test_several_rules_latest_wins_and_debt_is_kept() -> None:
    # The third request came after the first rule's DELAY_UNTIL T0+100 (its gatekeeper
    # had not heard it yet): it is recorded at T0+100 in both rules, so the second
    # rule's next allowed time is T0+100+1000.
    eng = engine(api=DomainPolicy((Rule(10.0, 2), Rule(1.0, 3))))
    out = eng.process([acc(b"a", T0), acc(b"a", T0), acc(b"a", T0)], T0)
    assert untils(out) == [(b"api", b"a", T0 + 100), (b"api", b"a", T0 + 1100)]


@pytest.mark.parametrize("algorithm", ["history", "gcra"])
def test_a_rule_given_twice_counts_once(algorithm: str) -> None:
    once = engine(api=DomainPolicy((Rule(1.0, 2),), algorithm))
    twice = engine(api=DomainPolicy((Rule(1.0, 2), Rule(1.0, 2)), algorithm))
    batch = [acc(b"a", T0) for _ in range(4)]
    assert twice.process(batch, T0) == once.process(batch, T0)


def test_gcra_domain() -> None:
    # rate 1/s, burst 2: I = 1000, B = 2000; cold key admits burst + 1 = 3
    eng = engine(g=DomainPolicy((Rule(1.0, 2),), "gcra"))
    out = eng.process([acc(b"k", T0, domain="g") for _ in range(4)], T0)
    assert untils(out) == [(b"g", b"k", T0 + 1000), (b"g", b"k", T0 + 2000)]


def test_rejected_counted_not_recorded() -> None:
    eng = engine(api=DomainPolicy((Rule(1.0, 1),)))
    assert eng.process([acc(b"a", T0, REJECTED) for _ in range(5)], T0) == []
    assert eng.stats.domains["api"].rejected == 5
    # the history is still empty, so the first accepted one only now fills it
    assert untils(eng.process([acc(b"a", T0)], T0)) == [(b"api", b"a", T0 + 1000)]


def test_unknown_domain_counted_and_ignored() -> None:
    eng = engine(api=DomainPolicy((Rule(1.0, 1),)))
    assert eng.process([acc(b"a", T0, domain="other") for _ in range(3)], T0) == []
    assert eng.stats.unknown_domain == 3
    assert "other" not in eng.stats.domains


def test_domain_without_rules_throttles_nothing() -> None:
    eng = engine(api=DomainPolicy(()))
    assert eng.process([acc(b"a", T0) for _ in range(10)], T0) == []
    assert eng.stats.domains["api"].accepted == 10


def test_skewed_timestamps_replaced_by_now() -> None:
    eng = engine(api=DomainPolicy((Rule(1.0, 2),)))
    far_future = T0 + 3_600_000
    out = eng.process([acc(b"a", far_future), acc(b"a", far_future)], T0)
    # accounted at now, not an hour ahead
    assert untils(out) == [(b"api", b"a", T0 + 1000)]
    assert eng.stats.domains["api"].skewed == 2
    # within tolerance (2 s by default) the message's own timestamp is used
    eng2 = engine(api=DomainPolicy((Rule(1.0, 1),)))
    assert untils(eng2.process([acc(b"a", T0 + 1500)], T0)) == [(b"api", b"a", T0 + 2500)]
    assert eng2.stats.domains["api"].skewed == 0


def test_skewed_delayed_keeps_its_delay() -> None:
    eng = Engine({"api": DomainPolicy((Rule(1.0, 1),))}, MemoryStore(), skew_tolerance_ms=100)
    out = eng.process([acc(b"a", T0 - 10_000, DELAYED, delayed=T0 - 9_500)], T0)
    assert untils(out) == [(b"api", b"a", T0 + 1500)]


def test_far_future_delayed_timestamp_is_clamped() -> None:
    """A DELAYED message claiming a delay of an hour is held to max_delay_ahead_ms."""
    eng = Engine({"api": DomainPolicy((Rule(1.0, 1),))}, MemoryStore(), max_delay_ahead_ms=5000)
    out = eng.process([acc(b"a", T0, DELAYED, delayed=T0 + 3_600_000)], T0)
    assert untils(out) == [(b"api", b"a", T0 + 6000)]
    assert eng.stats.domains["api"].skewed == 1
    # a delay within the cap is taken as it is and not counted
    eng2 = Engine({"api": DomainPolicy((Rule(1.0, 1),))}, MemoryStore(), max_delay_ahead_ms=5000)
    out2 = eng2.process([acc(b"a", T0, DELAYED, delayed=T0 + 4000)], T0)
    assert untils(out2) == [(b"api", b"a", T0 + 5000)]
    assert eng2.stats.domains["api"].skewed == 0
    # a message both far off the master's clock and far ahead in its delay counts once
    eng3 = Engine({"api": DomainPolicy((Rule(1.0, 1),))}, MemoryStore(), max_delay_ahead_ms=5000)
    out3 = eng3.process([acc(b"a", T0 - 10_000, DELAYED, delayed=T0 + 3_600_000)], T0)
    assert untils(out3) == [(b"api", b"a", T0 + 6000)]
    assert eng3.stats.domains["api"].skewed == 1


def test_a_late_master_does_not_lengthen_the_delay() -> None:
    """1/s burst 1, a request at T0: an instant master says T0+1000. A master 500 ms
    behind must not say T0+1500, and one 1200 ms behind has nothing left to say."""
    for lag, expected in (
        (0, [(b"api", b"a", T0 + 1000)]),
        (500, [(b"api", b"a", T0 + 1000)]),
        (1200, []),
    ):
        eng = engine(api=DomainPolicy((Rule(1.0, 1),)))
        assert untils(eng.process([acc(b"a", T0)], T0 + lag)) == expected


@settings(max_examples=150, deadline=None)
@given(
    rate=st.sampled_from([1.0, 4.0, 20.0]),
    burst=st.integers(1, 5),
    steps=st.lists(
        st.tuples(st.integers(0, 400), st.integers(0, 1900), st.booleans()),
        min_size=1,
        max_size=40,
    ),
)
def test_a_late_master_never_throttles_more_than_an_instant_one(
    rate: float, burst: int, steps: list[tuple[int, int, bool]]
) -> None:
    """The seed's overload rule: messages processed late (within the skew tolerance),
    one by one, never give a DELAY_UNTIL later than, or one where there was none from, a
    master processing each message at the instant it was stamped."""
    instant = engine(api=DomainPolicy((Rule(rate, burst),)))
    late = engine(api=DomainPolicy((Rule(rate, burst),)))
    ts, now = T0, T0
    for gap, lag, delayed in steps:
        ts += gap
        now = max(now, ts + lag)
        msg = acc(b"a", ts, DELAYED, delayed=ts + gap) if delayed else acc(b"a", ts)
        ideal = untils(instant.process([msg], ts))
        got = untils(late.process([msg], now))
        if got:
            assert ideal, f"throttled at {now} where an instant master did not"
            assert got[0][2] <= ideal[0][2]
            assert got[0][2] > now  # nothing already in the past is published


def test_garbage_between_valid_messages() -> None:
    eng = engine(api=DomainPolicy((Rule(1.0, 1),)))
    seen: list[str] = []
    eng.on_malformed = lambda exc, frames: seen.append(exc.reason)
    batch: list[list[bytes]] = [
        acc(b"a", T0),
        [b"\xff\x00garbage"],
        [b"api\0", b"ACCEPTED", b"b", b"-5", b""],
        acc(b"b", T0),
        [b"api", b"ACCEPTED", b"c", b"1", b""],
        [b"api\0", b"MAYBE", b"c", b"1", b""],
        [b"api\0", b"DELAYED", b"c", b"1", b""],
        [b"api\0", b"ACCEPTED", b"c", b"1", b"2"],
        [b"api\0", b"ACCEPTED", b"c" * 5000, b"1", b""],
        [b"api\0", b"ACCEPTED", b"c", b"99999999999999999", b""],
        [],
        acc(b"c", T0),
    ]
    out = eng.process(batch, T0)
    assert untils(out) == [
        (b"api", b"a", T0 + 1000),
        (b"api", b"b", T0 + 1000),
        (b"api", b"c", T0 + 1000),
    ]
    assert sum(eng.stats.malformed.values()) == 9 == len(seen)
    assert set(seen) == {
        "frame_count",
        "bad_timestamp",
        "domain_nul",
        "bad_status",
        "delayed_ts",
        "oversized",
    }
    assert eng.stats.domains["api"].malformed == 6


def test_loginfo_frame_accepted() -> None:
    eng = engine(api=DomainPolicy((Rule(1.0, 1),)))
    out = eng.process([encode_accounting("api", ACCEPTED, b"a", T0, None, b"UA: x")], T0)
    assert len(out) == 1


def test_reload_keeps_unchanged_rule_state() -> None:
    store = MemoryStore()
    eng = Engine({"api": DomainPolicy((Rule(1.0, 2),))}, store)
    eng.process([acc(b"a", T0)], T0)
    eng.configure({"api": DomainPolicy((Rule(1.0, 2),)), "new": DomainPolicy((Rule(1.0, 1),))})
    assert untils(eng.process([acc(b"a", T0)], T0)) == [(b"api", b"a", T0 + 1000)]
    eng.configure({"api": DomainPolicy((Rule(5.0, 2),))})  # changed rule: fresh state
    assert eng.process([acc(b"a", T0)], T0) == []
    assert len(store.tables) == 1


def test_bad_algorithm_and_tolerance() -> None:
    with pytest.raises(ConfigError, match="unknown algorithm 'leaky'"):
        DomainPolicy((), "leaky")
    with pytest.raises(ConfigError, match="skew tolerance"):
        Engine({}, MemoryStore(), skew_tolerance_ms=-1)


def history_oracle(stamps: list[int], now: int, rule: Rule) -> float | None:
    """The seed's rule over the whole, uncapped history of one identifier."""
    recent = [ts for ts in stamps if ts > now - rule.window_ms]
    if len(recent) < rule.burst:
        return None
    return max(now, stamps[-1]) + rule.interval_ms


@settings(max_examples=150, deadline=None)
@given(
    rules=st.lists(
        st.tuples(st.sampled_from([1.0, 2.0, 5.0, 10.0]), st.integers(1, 6)),
        min_size=1,
        max_size=3,
    ),
    steps=st.lists(st.tuples(st.integers(0, 900), st.booleans()), min_size=1, max_size=50),
)
def test_any_rule_throttles_latest_wins(
    rules: list[tuple[float, int]], steps: list[tuple[int, bool]]
) -> None:
    """Several rules on one domain against the oracle of the literal rule (every request
    recorded at its own time): a DELAY_UNTIL when any rule says so, for the latest of
    their answers; nothing otherwise."""
    policy = DomainPolicy(tuple(Rule(rate, burst) for rate, burst in rules), "history-literal")
    eng = engine(api=policy)
    stamps: list[int] = []
    ts = T0
    for gap, two_ids in steps:
        ts += gap
        ident = b"b" if two_ids and len(stamps) % 2 else b"a"
        got = untils(eng.process([acc(ident, ts)], ts))
        if ident == b"b":
            continue  # another identifier, its own history: only "a" is checked
        stamps.append(ts)
        answers = [history_oracle(stamps, ts, rule) for rule in policy.rules]
        expected = max((a for a in answers if a is not None), default=None)
        assert got == ([] if expected is None else [(b"api", b"a", int(expected))])
