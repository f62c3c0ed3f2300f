"""The Redis store against a real redis-server: batching, TTLs, restart keeps enforcing."""

from __future__ import annotations

import pytest

from smockron.core.rules import Rule
from smockron.errors import ConfigError
from smockron.master.domains import DomainPolicy
from smockron.master.engine import Engine
from smockron.master.stores import MemoryStore, open_store
from smockron.master.stores.redis import RedisStore
from smockron.wire.codec import ACCEPTED, DELAYED, decode_control, encode_accounting
from tests.support import RedisServer

PATIENT_S = 5.0
"""The store's timeout where the test is about what it writes, not about a slow Redis
(the default, 0.15 s, is met by a redis-server starved on a loaded machine)."""


def patient(server: RedisServer) -> RedisStore:
    return RedisStore(server.url, timeout_s=PATIENT_S)


T0 = 1_700_000_000_000


def acc(ident: bytes, ts: int, domain: str = "api") -> list[bytes]:
    return encode_accounting(domain, ACCEPTED, ident, ts)


async def run(eng: Engine, store: RedisStore, batch: list[list[bytes]], now: int) -> list[int]:
    store.tick(now)
    decoded = eng.decode(batch)
    await store.load(eng.touched(decoded))
    out = eng.apply(decoded, now)
    await store.flush()
    return [decode_control(c).until_ms for c in out]


POLICIES = {
    "api": DomainPolicy((Rule(1.0, 3),)),
    "g": DomainPolicy((Rule(1.0, 2), Rule(10.0, 1)), "gcra"),
    "h": DomainPolicy((Rule(2.0, 2), Rule(1.0, 3))),  # several history rules on tuples
}


async def test_same_results_as_memory(redis_server: RedisServer) -> None:
    store = patient(redis_server)
    eng = Engine(POLICIES, store)
    mem = Engine(POLICIES, MemoryStore())
    try:
        for step in range(6):
            now = T0 + step * 300
            batch = [acc(b"a", now), acc(b"b", now), acc(b"a", now, "g"), acc(b"a", now)]
            batch += [acc(b"a", now, "h"), acc(b"a", now + 50, "h")]
            expected = [decode_control(c).until_ms for c in mem.process(batch, now)]
            assert await run(eng, store, batch, now) == expected
        assert expected, "the example must throttle something"
    finally:
        await store.close()


async def test_keys_have_ttl_of_window(redis_server: RedisServer) -> None:
    store = patient(redis_server)
    eng = Engine({"api": DomainPolicy((Rule(1.0, 3),))}, store)  # window 3 s
    try:
        await run(eng, store, [acc(b"a", T0)], T0)
        keys = await store.client.keys("smockron:*")
        assert len(keys) == 1
        ttl = await store.client.pttl(keys[0])
        assert 1500 < ttl <= 3000  # slack for a loaded machine
    finally:
        await store.close()


async def test_delay_far_ahead_survives_in_memory_until_written(
    redis_server: RedisServer,
) -> None:
    """A busy master writes every 250 ms; a state with a DELAYED timestamp 30 s ahead,
    in a 200 ms window, must not be forgotten by memory before then (Redis does not have
    it yet), and its key's TTL runs to that timestamp plus the window."""
    store = patient(redis_server)
    eng = Engine({"api": DomainPolicy((Rule(10.0, 2),))}, store)  # interval 100, window 200

    async def step(batch: list[list[bytes]], now: int) -> list[int]:
        store.tick(now)
        decoded = eng.decode(batch)
        await store.load(eng.touched(decoded))
        return [decode_control(c).until_ms for c in eng.apply(decoded, now)]

    try:
        assert await step([encode_accounting("api", DELAYED, b"a", T0, T0 + 30_000)], T0) == []
        for t in range(100, 600, 100):  # rotations, and no write yet
            assert await step([], T0 + t) == []
        # history [T0+30000, T0+600]: two in the window, next allowed at T0+600 + 100
        assert await step([acc(b"a", T0 + 600)], T0 + 600) == [T0 + 700]
        await store.flush()
        (key,) = await store.client.keys("smockron:*")
        ttl = await store.client.pttl(key)
        assert 28_000 < ttl <= 29_600  # T0+30000 + 200 - (T0+600), less the test's time
    finally:
        await store.close()


async def test_one_command_per_batch_each_way(redis_server: RedisServer) -> None:
    store = patient(redis_server)
    eng = Engine({"api": DomainPolicy((Rule(1.0, 3),))}, store)

    async def evalsha_calls() -> int:
        stats = await store.client.info("commandstats")
        return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))

    try:
        await run(eng, store, [acc(b"id%d" % i, T0) for i in range(500)], T0)
        assert await evalsha_calls() == 2  # one read of the 500 misses, one write
        await run(eng, store, [acc(b"id%d" % i, T0) for i in range(500)], T0)
        assert await evalsha_calls() == 3  # known identifiers: no read, one write
    finally:
        await store.close()


async def test_redis_down_goes_on_from_memory(redis_server: RedisServer) -> None:
    store = patient(redis_server)
    eng = Engine({"api": DomainPolicy((Rule(1.0, 2),))}, store)
    try:
        await run(eng, store, [acc(b"a", T0)], T0)
        redis_server.stop()
        store.tick(T0)
        await store.flush(wait=False)
        assert eng.apply(eng.decode([acc(b"a", T0)]), T0)  # still throttles from memory
        await store.flush(wait=False)  # the write fails: counted, not raised
        await store.drain()
        assert store.errors == 1
    finally:
        redis_server.start()
        await store.close()


async def test_restart_keeps_enforcing(redis_server: RedisServer) -> None:
    store = patient(redis_server)
    eng = Engine({"api": DomainPolicy((Rule(1.0, 3),))}, store)
    try:
        assert await run(eng, store, [acc(b"a", T0), acc(b"a", T0)], T0) == []
    finally:
        await store.close()
    redis_server.restart()  # the server restarts (AOF) and a new master starts
    store2 = patient(redis_server)
    eng2 = Engine({"api": DomainPolicy((Rule(1.0, 3),))}, store2)
    try:
        assert await run(eng2, store2, [acc(b"a", T0 + 10)], T0 + 10) == [T0 + 1010]
    finally:
        await store2.close()


def test_open_store() -> None:
    assert isinstance(open_store("memory://"), MemoryStore)
    with pytest.raises(ConfigError, match="unknown store scheme"):
        open_store("mongo://x")
    with pytest.raises(ConfigError, match="not a URI"):
        open_store("memory")


@pytest.mark.parametrize("algorithm", ["history", "gcra"])
async def test_debt_survives_a_restart(redis_server: RedisServer, algorithm: str) -> None:
    """Ten requests at once against 1/s burst 2, none of whose gatekeepers had heard the
    master: the debt (the next allowed time 8-9 s ahead) is in Redis, so a master
    started afresh on the same Redis keeps holding the client back."""
    policies = {"api": DomainPolicy((Rule(1.0, 2),), algorithm)}
    first = patient(redis_server)
    try:
        out = await run(Engine(policies, first), first, [acc(b"d", T0)] * 10, T0)
        assert out[-1] >= T0 + 8000
    finally:
        await first.close()
    second = patient(redis_server)  # a new master: nothing in memory
    try:
        again = await run(Engine(policies, second), second, [acc(b"d", T0 + 100)], T0 + 100)
        assert again and again[0] >= T0 + 9000
    finally:
        await second.close()


@pytest.mark.slow
async def test_a_stopped_redis_does_not_stall_the_master(redis_server: RedisServer) -> None:
    """Redis SIGSTOPped (a network black hole alike): every batch is still decided
    within the call timeout, from memory; one line says so; when Redis answers again,
    what changed meanwhile is written."""
    import os
    import signal
    import time

    store = RedisStore(redis_server.url, timeout_s=0.1, retry_s=0.3)
    eng = Engine({"api": DomainPolicy((Rule(1.0, 2),))}, store)  # one request: no delay
    assert redis_server.proc is not None
    pid = redis_server.proc.pid
    try:
        await run(eng, store, [acc(b"warm", T0)], T0)
        os.kill(pid, signal.SIGSTOP)
        try:
            slowest, delays = 0.0, []
            for step in range(12):
                now = T0 + 100 * (step + 1)
                started = time.monotonic()
                batch = [acc(b"new-%d" % step, now), acc(b"abuser", now)]
                delays += await run(eng, store, batch, now)
                slowest = max(slowest, time.monotonic() - started)
            assert store.down_since is not None and store.errors >= 1
            assert slowest < 0.3, slowest  # the 0.1 s timeout, never a hang
            assert len(delays) == 11  # the abuser is held back all along, from memory
        finally:
            os.kill(pid, signal.SIGCONT)
        # after the breaker's retry time, Redis is tried again; on a loaded machine the
        # first probe may still time out (Redis catching up), so up to 5 tries
        for attempt in range(5):
            time.sleep(0.35)  # the breaker's retry time
            now = T0 + 2000 + 400 * attempt
            await run(eng, store, [acc(b"after", now)], now)
            if store.down_since is None:
                break
        assert store.down_since is None
        keys = {k.decode().rpartition(":")[2] for k in await store.client.keys("smockron:*")}
        assert {"new-0", "new-11", "after"} <= keys  # written once Redis answered
    finally:
        await store.close()
