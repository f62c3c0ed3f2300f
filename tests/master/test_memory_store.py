"""memory:// forgets a state once it can no longer matter, and no sooner."""

from __future__ import annotations

import gc
import struct
import threading

from smockron.core.rules import Rule
from smockron.master.domains import DomainPolicy
from smockron.master.engine import Engine
from smockron.master.stores.base import Scope
from smockron.master.stores.memory import (
    RELEASE_PER_TICK,
    MemoryStore,
    MemoryTable,
    _collector_paused,
    packed,
    unpacked,
)
from smockron.wire.codec import ACCEPTED, DELAYED, decode_control, encode_accounting

T0 = 1_700_000_000_000


def test_table_rotation() -> None:
    table = MemoryTable(1000.0)
    table.tick(0)
    table.put(b"a", (0.0,))
    table.tick(999)
    assert table.get(b"a") == (0.0,)
    table.tick(1000)  # rotated: "a" now in previous, still found and moved back
    assert len(table.previous) == 1
    assert table.get(b"a") == (0.0,)
    assert len(table.current) == 1 and not table.previous
    table.tick(2000)
    table.tick(3000)  # idle for two periods: gone
    assert table.get(b"a") is None
    assert len(table) == 0


def test_long_idle_drops_everything_at_once() -> None:
    table = MemoryTable(1000.0)
    table.tick(0)
    table.put(b"a", (0.0,))
    table.tick(5000)
    assert len(table) == 0


def test_many_identifiers_seen_once_cost_nothing_later() -> None:
    store = MemoryStore()
    eng = Engine({"api": DomainPolicy((Rule(10.0, 5), Rule(1.0, 2)))}, store)  # windows 0.5 s, 2 s
    eng.process((encode_accounting("api", ACCEPTED, b"id%d" % i, T0) for i in range(10_000)), T0)
    assert len(store) == 20_000
    eng.process([], T0 + 1_000)
    eng.process([], T0 + 5_000)
    assert len(store) == 0


def test_active_identifier_survives_rotation_and_keeps_throttling() -> None:
    store = MemoryStore()
    eng = Engine({"api": DomainPolicy((Rule(1.0, 2),))}, store)  # window 2 s
    for t in range(0, 10_000, 400):  # 2.5/s against 1/s: throttled all along
        out = eng.process([encode_accounting("api", ACCEPTED, b"a", T0 + t)], T0 + t)
    assert out, "a client over its rate must still be throttled after many rotations"


# ---------------------------------------------------------------- states that matter longer


def test_table_keeps_a_state_until_its_expiry_then_forgets_it() -> None:
    table = MemoryTable(1000.0)  # history expiry: newest timestamp + 1000
    table.tick(0)
    state = (30_000.0,)
    table.put(b"a", state)
    assert table.keep_after_ms == 1000
    table.keep(b"a", state, 31_000)
    assert table.lasting == {b"a": state}
    for t in range(500, 31_000, 500):  # many rotations: the generations drop it...
        table.tick(t)
        assert table.get(b"a") is state, t  # ...the side table still has it
    for t in range(31_000, 34_000, 500):
        table.tick(t)
    assert table.get(b"a") is None
    assert len(table) == 0 and not table.lasting and not table.due and not table.due_order


def test_table_refiles_a_kept_state_that_was_replaced() -> None:
    table = MemoryTable(1000.0)
    table.tick(0)
    state: tuple[float, ...] = (5_000.0,)
    table.put(b"a", state)
    table.keep(b"a", state, 6_000)
    table.tick(3_000)
    state = (5_000.0, 9_000.0)  # a later write: the side table follows it
    table.put(b"a", state)
    assert table.lasting[b"a"] is state
    for t in range(3_500, 10_000, 500):
        table.tick(t)
        assert table.get(b"a") is state, t  # refiled at its bucket, not dropped at 6 s
    for t in range(10_000, 12_500, 500):
        table.tick(t)
    assert table.get(b"a") is None and len(table) == 0


def test_common_states_never_reach_the_side_table() -> None:
    store = MemoryStore()
    eng = Engine({"api": DomainPolicy((Rule(10.0, 5),))}, store)
    for t in range(0, 5_000, 100):
        eng.process(
            [encode_accounting("api", ACCEPTED, b"u%d" % i, T0 + t) for i in range(20)], T0 + t
        )
    (table,) = store.tables.values()
    assert not table.lasting and not table.due


def test_dropped_generation_released_a_little_per_tick() -> None:
    table = MemoryTable(1000.0)
    table.tick(0)
    n = RELEASE_PER_TICK * 3 + 10
    for i in range(n):
        table.put(b"%d" % i, (0.0,))
    table.tick(1000)  # rotation: all in previous
    table.tick(2000)  # rotation: previous dropped, released from now on
    assert table.get(b"1") is None and len(table) == 0
    assert sum(map(len, table.dropped)) == n
    table.tick(2001)
    assert sum(map(len, table.dropped)) == n - RELEASE_PER_TICK
    for t in range(2002, 2010):
        table.tick(t)
    assert table.dropped == []


def test_idle_master_drops_both_generations() -> None:
    table = MemoryTable(1000.0)
    table.tick(0)
    table.put(b"a", (0.0,))
    table.tick(1000)
    table.put(b"b", (1000.0,))
    table.tick(5000)
    assert table.get(b"a") is None and table.get(b"b") is None and len(table) == 0


def test_delayed_far_ahead_still_throttles_after_many_windows() -> None:
    """A DELAYED timestamp 30 s ahead matters 30 s; the window is 2 s."""
    store = MemoryStore()
    eng = Engine({"api": DomainPolicy((Rule(1.0, 2),))}, store)  # interval 1 s, window 2 s
    delayed = encode_accounting("api", DELAYED, b"a", T0, T0 + 30_000)
    assert eng.process([delayed], T0) == []  # one timestamp: below the burst
    for t in range(500, 20_000, 500):  # idle for ten windows
        assert eng.process([], T0 + t) == []
    # the history [T0+30000, T0+20000] holds two timestamps in the window: throttled
    out = eng.process([encode_accounting("api", ACCEPTED, b"a", T0 + 20_000)], T0 + 20_000)
    assert [(c.identifier, c.until_ms) for c in map(decode_control, out)] == [(b"a", T0 + 21_000)]
    # once T0+20000 + 2 s has passed and T0+30000 + 2 s too, nothing is left
    for t in range(20_500, 35_000, 500):
        eng.process([], T0 + t)
    assert len(store) == 0
    assert eng.process([encode_accounting("api", ACCEPTED, b"a", T0 + 35_000)], T0 + 35_000) == []


def test_gcra_value_far_ahead_still_throttles_after_many_windows() -> None:
    store = MemoryStore()
    eng = Engine({"g": DomainPolicy((Rule(1.0, 2),), "gcra")}, store)  # I 1 s, B 2 s
    # 30 requests at T0: V = T0 - 2000 + 30 * 1000 = T0 + 28000
    eng.process([encode_accounting("g", ACCEPTED, b"k", T0) for _ in range(30)], T0)
    for t in range(500, 20_000, 500):
        eng.process([], T0 + t)
    out = eng.process([encode_accounting("g", ACCEPTED, b"k", T0 + 20_000)], T0 + 20_000)
    assert [c.until_ms for c in map(decode_control, out)] == [T0 + 29_000]
    for t in range(20_500, 33_000, 500):  # V = T0+29000 expires at T0+31000
        eng.process([], T0 + t)
    assert len(store) == 0


def test_same_decisions_as_a_store_that_never_forgets() -> None:
    """Random traffic with delays up to a minute ahead: memory:// decides exactly as a
    store that keeps every state forever."""
    import random

    class Forever(MemoryTable):
        def tick(self, now_ms: float) -> None:
            self.keep_after_ms = float("inf")

    class ForeverStore(MemoryStore):
        def _new_table(self, scope: Scope) -> MemoryTable:
            return Forever(scope.rule.window_ms)

    rng = random.Random(7)
    policies = {
        "h": DomainPolicy((Rule(2.0, 3), Rule(0.5, 2))),
        "g": DomainPolicy((Rule(2.0, 3),), "gcra"),
    }
    real, oracle = Engine(policies, MemoryStore()), Engine(policies, ForeverStore())
    now = T0
    for _ in range(3_000):
        now += rng.choice((0, 10, 100, 700, 3_000))
        batch = []
        for _ in range(rng.randint(0, 4)):
            dom, ident = rng.choice("hg"), b"%d" % rng.randint(0, 5)
            if rng.random() < 0.3:
                ahead = now + rng.randint(0, 60_000)
                batch.append(encode_accounting(dom, DELAYED, ident, now, ahead))
            else:
                batch.append(encode_accounting(dom, ACCEPTED, ident, now))
        assert real.process(batch, now) == oracle.process(batch, now), now


def test_stored_states_are_invisible_to_the_garbage_collector() -> None:
    """Tuples of floats, and dicts of them, are untracked by CPython's collector after
    one pass: a full collection then skips a million states instead of walking them."""
    store = MemoryStore()
    eng = Engine(
        {"h": DomainPolicy((Rule(10.0, 3),)), "g": DomainPolicy((Rule(10.0, 3),), "gcra")},
        store,
    )
    for t in range(3):  # a history of three timestamps each
        eng.process(
            [encode_accounting(d, ACCEPTED, b"id%d" % i, T0 + t) for d in "hg" for i in range(100)],
            T0 + t,
        )
    gc.collect()
    tables = list(store.tables.values())
    assert len(tables) == 2 and all(len(t.current) == 100 for t in tables)
    for table in tables:
        assert not any(gc.is_tracked(state) for state in table.current.values())
        assert not gc.is_tracked(table.current)


# ---------------------------------------------------------------- packed states


def test_packed_table_holds_bytes_and_speaks_tuples() -> None:
    """A packed table keeps one ``bytes`` per state; get, put, the expiry of its lasting
    states and ``states`` take and give tuples, ``keep`` the state as stored."""
    table = MemoryTable(1000.0, packed=True)
    table.tick(0)
    table.put(b"a", (1.5, 2.25))
    assert table.current[b"a"] == packed((1.5, 2.25)) == struct.pack("<2d", 1.5, 2.25)
    assert table.get(b"a") == (1.5, 2.25)
    table.put(b"b", (30_000.0,))
    table.keep(b"b", table.current[b"b"], 31_000)  # kept as stored: packed
    assert table.lasting == {b"b": packed((30_000.0,))}
    assert dict(table.states(list(table.current.items()))) == {
        b"a": (1.5, 2.25),
        b"b": (30_000.0,),
    }
    table.put(b"b", (30_000.0, 40_000.0))  # a later write: the side table follows it
    assert table.lasting[b"b"] == packed((30_000.0, 40_000.0))
    for t in range(500, 40_500, 500):  # refiled at its expiry (41 s), not dropped at 31 s
        table.tick(t)
        assert table.get(b"b") == (30_000.0, 40_000.0), t
    assert table.get(b"a") is None
    for t in range(41_000, 44_000, 500):
        table.tick(t)
    assert table.get(b"b") is None and len(table) == 0 and not table.lasting
    assert unpacked(packed(())) == ()


def test_history_states_are_never_tracked_by_the_collector() -> None:
    """The memory store's history tables hold packed states: untracked from the start,
    so young collections have nothing of theirs to visit; GCRA's hold each state's one
    float, no tuple around it."""
    store = MemoryStore()
    rule = Rule(10.0, 5)
    eng = Engine({"h": DomainPolicy((rule,)), "g": DomainPolicy((rule,), "gcra")}, store)
    for t in range(4):
        eng.process(
            [encode_accounting(d, ACCEPTED, b"id%d" % i, T0 + t) for d in "hg" for i in range(5)],
            T0 + t,
        )
    history, gcra = store.table(Scope("h", rule, "history")), store.table(Scope("g", rule, "gcra"))
    assert isinstance(history, MemoryTable) and isinstance(gcra, MemoryTable)
    assert history.packed and not gcra.packed and gcra.scalar and not history.scalar
    assert all(type(s) is bytes and not gc.is_tracked(s) for s in history.current.values())
    assert history.get(b"id0") == (T0, T0 + 1.0, T0 + 2.0, T0 + 3.0)
    assert all(type(s) is float for s in gcra.current.values())
    assert gcra.get(b"id0") == (T0 - rule.burst * rule.interval_ms + 4 * rule.interval_ms,)


def _pause_until(entered: threading.Event, leave: threading.Event) -> None:
    with _collector_paused():
        entered.set()
        leave.wait(5)


def test_overlapping_collector_pauses_give_it_back_when_the_last_ends() -> None:
    """Two pauses overlap (unpacking for RESYNCs in two threads), ending in either
    order: the collector is back on after the last, and stays off meanwhile."""
    assert gc.isenabled()
    for first_out in (0, 1):
        entered = [threading.Event(), threading.Event()]
        leave = [threading.Event(), threading.Event()]
        threads = [
            threading.Thread(target=_pause_until, args=(entered[i], leave[i])) for i in (0, 1)
        ]
        threads[0].start()
        assert entered[0].wait(5)
        threads[1].start()
        assert entered[1].wait(5)
        assert not gc.isenabled()
        leave[first_out].set()
        threads[first_out].join(5)
        assert not gc.isenabled()  # the other still unpacks
        leave[1 - first_out].set()
        threads[1 - first_out].join(5)
        assert gc.isenabled()
