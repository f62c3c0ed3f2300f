from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from smockron.core.gcra import expires_at, gcra_update
from smockron.core.rules import Rule


def test_cold_key_admits_burst_plus_one() -> None:
    rule = Rule(1.0, 3)  # I = 1000, B = 3000
    value = None
    delays = []
    for _ in range(5):
        value, delay = gcra_update(value, 0, 0, rule)
        delays.append(delay)
    assert delays == [None, None, None, 1000.0, 2000.0]
    assert value == 2000.0
    assert expires_at(value, rule) == 5000.0  # V + B: from then on the floor t - B is above V


def test_message_from_the_past_uses_now() -> None:
    rule = Rule(10.0, 1)  # I = 100, B = 100
    result = gcra_update(None, ts=0, now=5000, rule=rule)
    assert result.value == 5000.0
    assert expires_at(result.value, rule) == 5100.0
    assert result.delay_until is None


def test_future_timestamp_counts_from_itself() -> None:
    rule = Rule(10.0, 1)
    result = gcra_update(None, ts=6000, now=5000, rule=rule)
    assert result.value == 6000.0
    assert result.delay_until == 6000.0


def test_idle_key_recovers_full_burst() -> None:
    rule = Rule(2.0, 2)  # I = 500, B = 1000
    value = None
    for _ in range(4):
        value, _ = gcra_update(value, 0, 0, rule)
    assert value == 1000.0
    value, delay = gcra_update(value, 10_000, 10_000, rule)
    assert value == 9500.0 and delay is None


@settings(max_examples=200)
@given(
    rate=st.sampled_from([1.0, 4.0, 50.0]),
    burst=st.integers(1, 10),
    gaps=st.lists(st.integers(0, 400), min_size=1, max_size=150),
)
def test_obedient_client_bound(rate: float, burst: int, gaps: list[int]) -> None:
    """Honouring every DELAY_UNTIL, any window of T ms admits at most burst + 1 + rate x T."""
    rule = Rule(rate, burst)
    value = None
    delay_until: float | None = None
    now = 0.0
    times: list[float] = []
    for gap in gaps:
        now += gap
        if delay_until is not None and delay_until > now:
            now = delay_until
        times.append(now)
        value, delay_until = gcra_update(value, now, now, rule)
    for i, start in enumerate(times):
        for j in range(i, len(times)):
            span = times[j] - start
            assert j - i + 1 <= burst + 1 + rate * span / 1000.0 + 1e-9


def gcra_oracle(ts: list[int], nows: list[int], rule: Rule) -> float:
    """V after every request, from the whole list at once: unrolling
    ``V = max(V, t - B) + I`` gives ``max over k of t_k - B + (n - k + 1) x I``."""
    interval = rule.interval_ms
    tolerance = rule.burst * interval
    n = len(ts)
    return max(max(ts[k], nows[k]) - tolerance + (n - k) * interval for k in range(n))


@settings(max_examples=300)
@given(
    rate=st.sampled_from([1.0, 2.0, 4.0, 8.0, 10.0]),  # 1000 / rate is exact
    burst=st.integers(1, 10),
    steps=st.lists(
        st.tuples(st.integers(0, 700), st.integers(-3000, 3000)), min_size=1, max_size=60
    ),
)
def test_matches_brute_force_oracle(rate: float, burst: int, steps: list[tuple[int, int]]) -> None:
    """Any timestamps (late, early, out of order) against the closed form over the whole
    history; DELAY_UNTIL is published exactly when V is after now."""
    rule = Rule(rate, burst)
    value: float | None = None
    now = 1_000_000
    ts: list[int] = []
    nows: list[int] = []
    for gap, offset in steps:
        now += gap
        ts.append(now + offset)
        nows.append(now)
        value, delay = gcra_update(value, ts[-1], now, rule)
        assert value == gcra_oracle(ts, nows, rule)
        assert delay == (value if value > now else None)
        # after its expiry the state is reset anyway: the floor t - B is above V
        later = expires_at(value, rule) + 1
        assert gcra_update(value, later, later, rule) == gcra_update(None, later, later, rule)
