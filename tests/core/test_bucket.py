from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smockron.core.bucket import RefillBucket


def test_refill_caps_at_burst() -> None:
    b = RefillBucket.full(10, 1.0, now=0.0)
    for _ in range(10):
        assert b.try_take(0.0)
    assert not b.try_take(0.0)
    assert b.refill(3.5) == pytest.approx(3.5)
    assert b.refill(100.0) == 10


def test_ok_with_a_whole_token_and_refusal_is_free() -> None:
    b = RefillBucket(10, 1.0, tokens=1.5, updated=0.0)
    assert b.try_take(0.0)  # a whole token: served, 0.5 left
    assert b.tokens == 0.5
    assert not b.try_take(0.0)  # half a token is not one
    assert b.tokens == 0.5
    assert b.try_take(0.5)  # refilled to 1.0


def test_a_burst_of_ten_serves_ten_even_spread_over_a_few_ms() -> None:
    """The original DThrottle's example: burst 10, rate 1/s. Queries a few ms apart
    refill a sliver between them, which must not buy an 11th."""
    b = RefillBucket.full(10, 1.0, now=0.0)
    served = sum(b.try_take(0.003 * i) for i in range(12))
    assert served == 10


def test_a_debt_refills_to_exactly_one_token() -> None:
    b = RefillBucket(10, 1.0, tokens=0.0, updated=0.0)
    b.subtract(0.0, 3)  # -3: a peer's report
    assert not b.try_take(3.9)
    assert b.try_take(4.0)  # back to 1 after 4 s


def test_subtract_goes_negative_and_delays_refill() -> None:
    b = RefillBucket(10, 1.0, tokens=0.0, updated=0.0)
    b.subtract(5.0, 8)  # refilled to 5, minus 8
    assert b.tokens == pytest.approx(-3)
    assert b.time_until(5.0) == pytest.approx(4.0)


def test_clock_going_back_refills_nothing() -> None:
    b = RefillBucket(10, 1.0, tokens=2.0, updated=5.0)
    assert b.refill(1.0) == 2.0
    assert b.updated == 5.0


@given(st.lists(st.tuples(st.floats(0, 10), st.booleans()), max_size=80))
def test_tokens_never_exceed_burst(steps: list[tuple[float, bool]]) -> None:
    b = RefillBucket.full(5, 2.0, 0.0)
    now = 0.0
    for gap, take in steps:
        now += gap
        if take:
            b.try_take(now)
        assert b.tokens <= 5
