"""The memory store's snapshot: a restarted master remembers who owes what, skips what
has expired, and refuses a damaged file (one warning, empty start)."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from pathlib import Path

import pytest

from smockron.core.rules import Rule
from smockron.errors import ConfigError
from smockron.master.domains import DomainPolicy
from smockron.master.engine import Engine
from smockron.master.stores import open_store
from smockron.master.stores import snapshot as snapshot_file
from smockron.master.stores.memory import MemoryStore, packed
from smockron.wire.codec import ACCEPTED, decode_control, encode_accounting

T0 = 1_700_000_000_000
POLICIES = {
    "api": DomainPolicy((Rule(1.0, 3),)),  # history: 3 per 3 s
    "g": DomainPolicy((Rule(2.0, 4),), "gcra"),
}


def send(store: MemoryStore, eng: Engine, domain: str, ident: bytes, n: int, now: int) -> int:
    """``n`` ACCEPTED requests at ``now``; how many DELAY_UNTILs the master answers."""
    store.tick(now)
    batch = [encode_accounting(domain, ACCEPTED, ident, now) for _ in range(n)]
    return len([decode_control(c) for c in eng.apply(eng.decode(batch), now)])


async def test_a_restarted_store_remembers_the_abuser(tmp_path: Path) -> None:
    path = tmp_path / "states.snap"
    first = MemoryStore(path, now_ms=T0)
    eng = Engine(POLICIES, first)
    assert send(first, eng, "api", b"abuser", 10, T0) > 0
    assert send(first, eng, "g", b"abuser", 20, T0) > 0
    await first.close()  # the shutdown snapshot
    assert path.exists() and not path.with_name("states.snap.tmp").exists()

    again = MemoryStore(path, now_ms=T0 + 500)
    assert again.snapshot_states == 2
    eng2 = Engine(POLICIES, again)
    # no fresh burst: the first request after the restart is held back already
    assert send(again, eng2, "api", b"abuser", 1, T0 + 500) == 1
    assert send(again, eng2, "g", b"abuser", 1, T0 + 500) == 1
    # a control: a store without the snapshot forgives (so the check above can fail)
    fresh = MemoryStore(now_ms=T0 + 500)
    assert send(fresh, Engine(POLICIES, fresh), "api", b"abuser", 1, T0 + 500) == 0


async def test_expired_states_and_changed_rules_are_not_loaded(tmp_path: Path) -> None:
    path = tmp_path / "states.snap"
    first = MemoryStore(path, now_ms=T0)
    eng = Engine(POLICIES, first)
    send(first, eng, "api", b"old", 3, T0)
    send(first, eng, "api", b"recent", 3, T0 + 2_000)
    await first.close()
    later = MemoryStore(path, now_ms=T0 + 4_000)  # "old" expired at T0 + 3 s
    Engine(POLICIES, later)
    table = next(t for s, t in later.tables.items() if s.domain == "api")
    assert set(table.current) == {b"recent"}
    changed = MemoryStore(path, now_ms=T0 + 4_000)
    Engine({"api": DomainPolicy((Rule(5.0, 3),))}, changed)  # another rule: moot
    assert sum(len(t) for t in changed.tables.values()) == 0


async def test_periodic_snapshot_is_written_when_due(tmp_path: Path) -> None:
    path = tmp_path / "states.snap"
    store = MemoryStore(path, snapshot_interval_s=1.0, now_ms=T0)
    eng = Engine(POLICIES, store)
    send(store, eng, "api", b"a", 2, T0)
    assert not store.due(T0 + 999)
    await store.flush()
    assert not path.exists()
    send(store, eng, "api", b"b", 2, T0 + 1_000)
    assert store.due(T0 + 1_000)
    await store.flush(wait=True)
    assert store.snapshot_writes == 1
    written = snapshot_file.read(path)
    assert written is not None and sum(len(states) for states in written.values()) == 2
    assert not store.due(T0 + 1_500)
    # in the background, as the master writes it: one after the other, each when due
    for step in (2, 3):
        send(store, eng, "api", b"c%d" % step, 1, T0 + 1_000 * step)
        await store.flush(wait=False)
        for _ in range(500):  # the master never drains: the finished write must not block
            if store.snapshot_writes == step:
                break
            await asyncio.sleep(0.01)
    assert store.snapshot_writes == 3 and store.snapshot_states == 4


@pytest.mark.parametrize(
    "damage",
    [
        lambda blob: blob[: len(blob) // 2],  # truncated
        lambda blob: blob[:20] + bytes([blob[20] ^ 0xFF]) + blob[21:],  # a flipped byte
        lambda blob: b"SMKSNAP\x09" + blob[8:],  # another version
        lambda blob: b"\n\x1b[31mforged\x00",  # not a snapshot at all
    ],
)
async def test_a_damaged_snapshot_is_refused_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object
) -> None:
    path = tmp_path / "states.snap"
    first = MemoryStore(path, now_ms=T0)
    send(first, Engine(POLICIES, first), "api", b"abuser", 10, T0)
    await first.close()
    path.write_bytes(damage(path.read_bytes()))  # type: ignore[operator]
    caplog.set_level(logging.INFO, "smockron.master.store")
    store = MemoryStore(path, now_ms=T0 + 100)
    eng = Engine(POLICIES, store)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "refused" in warnings[0].getMessage()
    assert "\x1b" not in warnings[0].getMessage()
    assert sum(len(t) for t in store.tables.values()) == 0
    assert send(store, eng, "api", b"abuser", 1, T0 + 100) == 0  # empty start, serving


async def test_an_unwritable_snapshot_is_counted_not_raised(tmp_path: Path) -> None:
    path = tmp_path / "missing-dir" / "states.snap"
    store = MemoryStore(path, snapshot_interval_s=1.0, now_ms=T0)
    send(store, Engine(POLICIES, store), "api", b"a", 1, T0 + 1_000)
    await store.flush(wait=True)
    await store.close()
    assert store.snapshot_failures == 2 and store.snapshot_writes == 0


def test_open_store_passes_the_snapshot(tmp_path: Path) -> None:
    store = open_store("memory://", snapshot=str(tmp_path / "s"), snapshot_interval=5.0)
    assert isinstance(store, MemoryStore)
    assert store.snapshot == tmp_path / "s" and store.snapshot_interval_ms == 5_000.0


def test_settings_take_the_snapshot(tmp_path: Path) -> None:
    from smockron.master.config import load_settings

    conf = tmp_path / "m.toml"
    conf.write_text(f'snapshot = "{tmp_path / "s"}"\nsnapshot_interval = "5s"\n')
    settings = load_settings(conf)
    assert settings.snapshot == str(tmp_path / "s") and settings.snapshot_interval == 5.0
    with pytest.raises(ConfigError, match="memory store"):
        load_settings(overrides={"snapshot": "x", "store": "redis://127.0.0.1:6379/0"})
    with pytest.raises(ConfigError, match="snapshot_interval"):
        load_settings(overrides={"snapshot_interval": 0})


async def test_snapshot_metrics(tmp_path: Path) -> None:
    from smockron.master.metrics import StatsCollector
    from smockron.master.stats import Stats

    store = MemoryStore(tmp_path / "s", now_ms=T0)
    send(store, Engine(POLICIES, store), "api", b"a", 1, T0)
    await store.close()
    values = {
        sample.name: sample.value
        for family in StatsCollector(Stats(), store=store).collect()
        for sample in family.samples
    }
    assert values["smockron_master_store_snapshot_writes_total"] == 1
    assert values["smockron_master_store_snapshot_states"] == 1
    assert "smockron_master_store_breaker_state" not in values


async def test_the_snapshot_is_private_whatever_the_umask(tmp_path: Path) -> None:
    """The snapshot holds identifiers (API keys): owner-only, even over an old 0644 file."""
    path = tmp_path / "states.snap"
    path.write_bytes(b"old")
    path.chmod(0o644)
    path.with_name("states.snap.tmp").write_bytes(b"left over")
    path.with_name("states.snap.tmp").chmod(0o644)
    old = os.umask(0o022)
    try:
        store = MemoryStore(path, now_ms=T0)
        send(store, Engine(POLICIES, store), "api", b"secret-key", 3, T0)
        await store.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert MemoryStore(path, now_ms=T0).snapshot_states == 1  # the write did happen


def test_packed_states_are_written_as_the_tuples_they_hold() -> None:
    """The memory store's history tables hold packed states; the file is the same as
    for their tuples (the snapshot writes the bytes as they are), and reads back as
    the tuples, an empty state skipped either way."""
    states = [(b"a", (1.5, 2.0, 3.25)), (b"b", ()), (b"c", (T0 + 0.5,))]
    as_tuples = snapshot_file.encode({b"history:api:1:3:": states})
    as_packed = snapshot_file.encode({b"history:api:1:3:": [(k, packed(s)) for k, s in states]})
    assert as_packed == as_tuples
    assert snapshot_file.decode(as_packed) == {
        b"history:api:1:3:": {b"a": (1.5, 2.0, 3.25), b"c": (T0 + 0.5,)}
    }


def test_scalar_states_are_written_as_the_1_tuples_they_stand_for() -> None:
    """The memory store's GCRA tables hold each state as its one float; the file is the
    same as for the 1-tuples, and reads back as them."""
    states = [(b"a", (T0 + 0.5,)), (b"b", (-3.0,))]
    as_tuples = snapshot_file.encode({b"gcra:g:2:4:": states})
    as_floats = snapshot_file.encode({b"gcra:g:2:4:": [(k, s[0]) for k, s in states]})
    assert as_floats == as_tuples
    assert snapshot_file.decode(as_floats) == {b"gcra:g:2:4:": dict(states)}
