"""The pure table and decision rule, with an injected clock."""

from __future__ import annotations

import pytest

from smockron.errors import ConfigError
from smockron.gatekeeper._decider import Decider, Verdict
from smockron.gatekeeper._table import EVICT_STEPS, DelayTable

D, ID = b"api", b"alice"


def test_table_only_moves_forward() -> None:
    t = DelayTable()
    assert t.update(D, ID, 2000, now_ms=1000)
    assert not t.update(D, ID, 1500, now_ms=1000)
    assert t.until(D, ID, 1000) == 2000
    assert t.update(D, ID, 2500, now_ms=1000)
    assert t.until(D, ID, 1000) == 2500


def test_passed_entries_are_ignored_and_swept() -> None:
    t = DelayTable()
    assert not t.update(D, ID, 1000, now_ms=1000)  # already passed: not stored
    t.update(D, ID, 2000, now_ms=1000)
    t.update(D, b"bob", 5000, now_ms=1000)
    assert t.until(D, ID, 2000) == 0
    assert t.sweep(2000) == 1
    assert len(t) == 1
    assert t.until(D, b"bob", 2000) == 5000


def test_table_is_bounded() -> None:
    t = DelayTable(max_entries=10)
    for i in range(25):  # later ones expire later: a full table forgets the earliest
        t.update(D, b"id%d" % i, 10_000 + i, now_ms=0)
    assert len(t) == 10
    assert t.evicted == 15
    assert t.until(D, b"id24", 0) == 10_024 and t.until(D, b"id0", 0) == 0
    # once the entries pass, room is made again on the next insert
    assert t.update(D, b"late", 30_000, now_ms=20_000)
    assert len(t) == 1


def test_a_wave_of_max_entries_evicts_one_small_step() -> None:
    """A wave of exactly ``max_entries`` into a table holding one entry more forgets a
    small step of the soonest to expire, not an eighth of the live verdicts."""
    size = 16_384
    t = DelayTable(max_entries=size)
    t.update(D, b"probe", 10_000, now_ms=0)  # expires soonest
    wave = [(D, b"id-%d" % i, 10_001 + i) for i in range(size)]
    for start in range(0, size, 256):  # as the control reader applies them
        t.update_many(wave[start : start + 256], now_ms=0)
    step = size // EVICT_STEPS
    assert t.evicted == step and len(t) == size + 1 - step
    assert t.until(D, b"probe", 0) == 0
    assert [t.until(D, b"id-%d" % i, 0) for i in range(step - 1)] == [0] * (step - 1)
    assert t.until(D, b"id-%d" % (step - 1), 0) == 10_000 + step  # the rest are kept


def test_a_flood_evicts_step_by_step_and_counts_each() -> None:
    """New identifiers past the bound: the table stays within it, every entry that
    made room is counted, and the ones kept are the latest to expire."""
    t = DelayTable(max_entries=4096)
    flood = [(D, b"id-%d" % i, 10_000 + i) for i in range(10_000)]
    for start in range(0, len(flood), 100):
        t.update_many(flood[start : start + 100], now_ms=start // 100)  # the clock moves on
        assert len(t) <= 4096
    assert t.evicted == len(flood) - len(t)
    assert len(t) > 4096 - 4096 // EVICT_STEPS - 100
    kept = {i for i in range(len(flood)) if t.until(D, b"id-%d" % i, 0)}
    assert kept == set(range(len(flood) - len(t), len(flood)))


def test_many_identifiers_with_passing_time_stay_bounded() -> None:
    t = DelayTable(max_entries=100_000)
    for i in range(50_000):
        t.update(D, b"%d" % i, i + 10, now_ms=i)
    assert len(t) <= 2048 + 10


def test_decide_accept_delay_reject() -> None:
    d = Decider(max_delay_ms=500, max_delayed=2)
    assert d.decide(D, ID, 1000).verdict is Verdict.ACCEPT
    d.table.update(D, ID, 1400, now_ms=1000)
    first = d.decide(D, ID, 1000)
    assert first.verdict is Verdict.DELAY and first.until_ms == 1400 and first.wait_ms == 400
    assert d.decide(D, ID, 1000).verdict is Verdict.DELAY
    full = d.decide(D, ID, 1000)  # two already waiting
    assert full.verdict is Verdict.REJECT and full.wait_ms == 400
    d.release()
    assert d.decide(D, ID, 1000).verdict is Verdict.DELAY
    d.table.update(D, ID, 1600, now_ms=1000)
    d.release()
    d.release()
    too_long = d.decide(D, ID, 1000)  # 600 ms > max_delay
    assert too_long.verdict is Verdict.REJECT
    assert d.decide(D, ID, 1600).verdict is Verdict.ACCEPT
    assert d.decide(b"other", ID, 1000).verdict is Verdict.ACCEPT
    c = d.counters
    assert (c.accepted, c.delayed, c.rejected) == (3, 3, 2)


def test_release_never_goes_negative() -> None:
    d = Decider()
    d.release()
    assert d.waiting == 0


@pytest.mark.parametrize("kwargs", [{"max_delay_ms": -1}, {"max_delayed": -1}, {"max_entries": 0}])
def test_bad_settings_are_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        Decider(**kwargs)


def test_defaults_are_the_original_gatekeepers_and_bounds_are_inclusive() -> None:
    d = Decider()
    assert (d.max_delay_ms, d.max_delayed) == (5000, 1000)
    d.table.update(D, ID, 6000, now_ms=1000)
    assert d.decide(D, ID, 1000).verdict is Verdict.DELAY  # a wait of exactly 5 s is allowed
    assert d.decide(D, ID, 999).verdict is Verdict.REJECT  # 5.001 s is not


def test_a_flood_of_delay_untils_cannot_lock_out_new_ones() -> None:
    """A table filled by a million fake identifiers still takes the real master's
    next DELAY_UNTIL: the entries that expire soonest make room."""
    t = DelayTable(max_entries=1000)
    for i in range(5000):
        t.update(D, b"fake%d" % i, 2000, now_ms=0)
    assert len(t) <= 1000
    assert t.update(D, b"abuser", 5000, now_ms=0)
    assert t.until(D, b"abuser", 100) == 5000


def test_far_future_delay_until_is_refused() -> None:
    t = DelayTable(max_ahead_ms=60_000)
    assert not t.update(D, b"victim", 253_402_300_799_000, now_ms=1000)  # the year 9999
    assert not t.update(D, b"victim", 61_001 + 1000, now_ms=1000)
    assert t.refused == 2 and t.until(D, b"victim", 1000) == 0
    assert t.update(D, b"victim", 60_000 + 1000, now_ms=1000)
