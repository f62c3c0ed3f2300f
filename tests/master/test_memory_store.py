"""memory:// forgets idle histories: bounded by identifiers active in two windows."""

from __future__ import annotations

from smockron.core.rules import Rule
from smockron.master.engine import DomainPolicy, Engine
from smockron.master.stores.memory import MemoryStore, MemoryTable
from smockron.protocol import ACCEPTED, encode_accounting

T0 = 1_700_000_000_000


def test_table_rotation() -> None:
    table = MemoryTable(1000.0)
    table.tick(0)
    table.put(b"a", [0.0])
    table.tick(999)
    assert table.get(b"a") == [0.0]
    table.tick(1000)  # rotated: "a" now in previous, still found and moved back
    assert len(table.previous) == 1
    assert table.get(b"a") == [0.0]
    assert len(table.current) == 1 and not table.previous
    table.tick(2000)
    table.tick(3000)  # idle for two periods: gone
    assert table.get(b"a") is None
    assert len(table) == 0


def test_long_idle_drops_everything_at_once() -> None:
    table = MemoryTable(1000.0)
    table.tick(0)
    table.put(b"a", [0.0])
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
