"""Every store through the one ``Store`` protocol the master uses: the same batches
give the same DELAY_UNTILs, and a persistent store hands its states to its successor."""

from __future__ import annotations

import time

import pytest

from smockron.core.rules import Rule
from smockron.master.domains import DomainPolicy
from smockron.master.engine import Engine
from smockron.master.stores import Store, open_store
from smockron.wire.codec import ACCEPTED, decode_control, encode_accounting
from tests.support import RedisServer

POLICY = {"api": DomainPolicy((Rule(1.0, 2),), "gcra")}  # the original layout keeps GCRA


async def one_batch(engine: Engine, store: Store, now: int) -> list[int]:
    """The master's steps for one batch, in its order (see Master._process_batch)."""
    decoded = engine.decode([encode_accounting("api", ACCEPTED, b"a", now)])
    store.tick(now)
    await store.load(engine.touched(decoded))
    out = engine.apply(decoded, now)
    if store.due(now):
        await store.flush(wait=False)
    return [decode_control(c).until_ms for c in out]


@pytest.mark.parametrize("uri", ["memory://", "redis://", "redis://?layout=original"])
async def test_every_store_serves_the_one_loop(uri: str, redis_server: RedisServer) -> None:
    url = uri if uri == "memory://" else uri.replace("redis://", redis_server.url)
    t0 = int(time.time() * 1000)  # the original layout expires its keys at real times
    store = open_store(url)
    engine = Engine(POLICY, store)
    try:
        assert await store.ping()
        got = [await one_batch(engine, store, t0 + i * 100) for i in range(4)]
        await store.flush(wait=True)
    finally:
        await store.close()
    reference = Engine(POLICY, open_store("memory://"))
    expected = [
        [
            decode_control(c).until_ms
            for c in reference.process(
                [encode_accounting("api", ACCEPTED, b"a", t0 + i * 100)], t0 + i * 100
            )
        ]
        for i in range(4)
    ]
    assert got == expected
    assert got[-1], "the example must throttle"
    successor = open_store(url)
    try:
        after = await one_batch(Engine(POLICY, successor), successor, t0 + 400)
    finally:
        await successor.close()
    assert bool(after) == store.writes_behind  # only a persistent store remembers
