"""The Master object in-process: shutdown writes what changed to Redis."""

from __future__ import annotations

import time

import redis
import zmq

from smockron.core.rules import Rule
from smockron.master.config import MasterSettings
from smockron.master.domains import DomainPolicy
from smockron.master.engine import Frames
from smockron.master.server import Master
from smockron.wire.codec import ACCEPTED, encode_accounting
from tests.support import RedisServer


async def test_close_writes_dirty_state(redis_server: RedisServer) -> None:
    settings = MasterSettings(
        store=redis_server.url, domains={"api": DomainPolicy((Rule(1.0, 3),))}
    )
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    master = Master(settings, context=ctx)
    now = time.time() * 1000
    master.store.tick(now)
    master.engine.apply(
        master.engine.decode([encode_accounting("api", ACCEPTED, b"z", int(now))]), now
    )
    client = redis.Redis.from_url(redis_server.url)
    try:
        assert client.keys("*") == []  # not written yet: the interval has not passed
        await master.close()
        found = client.keys("*")
        assert isinstance(found, list) and len(found) == 1
        assert str(found[0]).endswith(":z'")
    finally:
        client.close()
        ctx.term()


def test_full_queue_drops_newest_and_counts_them() -> None:
    settings = MasterSettings(queue=5, domains={"api": DomainPolicy((Rule(1.0, 3),))})
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    master = Master(settings, context=ctx)
    try:
        now = int(time.time() * 1000)
        valid = [encode_accounting("api", ACCEPTED, b"id%d" % i, now) for i in range(4)]
        decoded = master.engine.decode(valid)
        master.engine.stats.domains["api"].accepted = 0  # only the queue is tested here
        raw: list[Frames] = [[b"api\0", b"garbage"], [b"other\0"], [b"api\0", b"x"]]
        master._enqueue((decoded, raw, 0.0))
        assert master.pending_count == 5
        assert master.stats.dropped == 2
        assert master.stats.domains["api"].dropped == 1  # "other" is not configured
        master._enqueue((decoded[:1], [], 0.0))
        assert master.pending_count == 5 and master.stats.dropped == 3
        assert master.stats.domains["api"].dropped == 2
    finally:
        master.sub.close()
        master.pub.close()
        ctx.term()
