"""The Master object in-process: shutdown writes what changed to Redis."""

from __future__ import annotations

import time

import redis
import zmq

from smockron.core.rules import Rule
from smockron.master.config import MasterSettings
from smockron.master.engine import DomainPolicy
from smockron.master.server import Master
from smockron.protocol import ACCEPTED, encode_accounting
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
