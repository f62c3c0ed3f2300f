"""JARL's algorithm, exactly, with an injected clock."""

from __future__ import annotations

import pytest

from smockron.daemons.jarl.algorithm import Jarl, format_delay
from smockron.errors import ConfigError


def test_first_requests_in_a_period_get_zero() -> None:
    jarl = Jarl(requests=3, period=10)
    assert [jarl.delay(t) for t in (0.0, 1.0, 2.0)] == [0.0, 0.0, 0.0]


def test_over_the_limit_waits_for_the_oldest_plus_base_delay_times_counter() -> None:
    jarl = Jarl(requests=3, period=10)  # base_delay = 10/3
    for t in (0.0, 1.0, 2.0):
        jarl.delay(t)
    # queue [0,1,2,3] -> drop 0, diff 3 < 10: counter 1, 10/3*1 + 7
    assert jarl.delay(3.0) == pytest.approx(10 / 3 + 7)
    # queue [1,2,3,4] -> drop 1, diff 3: counter 2
    assert jarl.delay(4.0) == pytest.approx(10 / 3 * 2 + 7)
    assert jarl.counter == 2


def test_a_gap_of_a_full_period_resets_the_counter() -> None:
    jarl = Jarl(requests=2, period=5)
    for t in (0.0, 0.0, 0.0, 0.0):
        jarl.delay(t)
    assert jarl.counter == 2
    # queue [0,0,5] -> drop 0, diff 5 == period: not < period -> zero and reset
    assert jarl.delay(5.0) == 0.0
    assert jarl.counter == 0
    # queue [0,5,5.5] -> drop 0, diff 5.5 -> zero again
    assert jarl.delay(5.5) == 0.0
    # queue [5,5.5,6] -> drop 5, diff 1: counter restarts at 1
    assert jarl.delay(6.0) == pytest.approx(2.5 * 1 + 4.0)


def test_one_queue_for_all_clients_in_order_of_arrival() -> None:
    """The original keeps one deque per process: its length never exceeds requests."""
    jarl = Jarl(requests=4, period=1)
    for i in range(100):
        jarl.delay(i * 0.001)
    assert len(jarl._arrivals) == 4


def test_base_delay_has_a_floor_of_ten_milliseconds() -> None:
    assert Jarl(requests=1000, period=1).base_delay == 0.01
    assert Jarl(requests=100, period=1).base_delay == 0.01
    assert Jarl(requests=200, period=60).base_delay == pytest.approx(0.3)


def test_the_seed_example_social_media_200_per_minute() -> None:
    jarl = Jarl(requests=200, period=60)
    answers = [jarl.delay(0.5) for _ in range(203)]
    assert answers[:200] == [0.0] * 200
    assert answers[200:] == pytest.approx([0.3 * 1 + 60, 0.3 * 2 + 60, 0.3 * 3 + 60])
    assert [format_delay(a) for a in answers[199:]] == [b"0.000", b"60.300", b"60.600", b"60.900"]


@pytest.mark.parametrize(
    ("seconds", "wire"),
    [
        (0.0, b"0.000"),
        (0.0004, b"0.000"),
        (0.0005, b"0.001"),
        (1.23456, b"1.235"),
        (60.3, b"60.300"),
        (12345.6789, b"12345.679"),
    ],
)
def test_answer_has_exactly_three_decimals_and_no_newline(seconds: float, wire: bytes) -> None:
    assert format_delay(seconds) == wire


@pytest.mark.parametrize(("requests", "period"), [(0, 1), (1, 0), (-1, 5), (5, -1), (True, 1)])
def test_zero_or_negative_limits_are_refused_with_the_value_named(
    requests: int, period: int
) -> None:
    with pytest.raises(ConfigError, match="must be a whole number"):
        Jarl(requests=requests, period=period)
