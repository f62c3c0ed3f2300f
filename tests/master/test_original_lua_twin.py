"""The original layout's write script (``_WRITE_LUA``, run by a real redis-server) against
its twin, :func:`smockron.core.gcra.gcra_update`: same stored value for any previous
value, time and rule, and the expiry it is given."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from smockron.core.gcra import gcra_update
from smockron.core.rules import Rule
from smockron.master.stores.original import _OP, _WRITE_LUA
from smockron.master.stores.redis import _LEN
from tests.support import start_redis

T0 = int(time.time() * 1000) + 86_400_000
"""A day ahead: an expiry in the past would delete the key before it is read."""
KEY = b"throttle;api;x"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    server = start_redis(Path(tmp_path_factory.mktemp("redis")))
    try:
        yield redis.Redis(port=server.port)
    finally:
        server.stop()


@settings(max_examples=200, deadline=None)
@given(
    rule=st.builds(Rule, st.sampled_from([0.5, 1.0, 3.0, 7.0, 100.0]), st.integers(1, 20)),
    previous=st.none() | st.integers(-100_000, 100_000),
    at=st.integers(0, 100_000),
)
def test_write_script_is_gcra(db: redis.Redis, rule: Rule, previous: int | None, at: int) -> None:
    """``t`` is what the engine accounts at (``max(ts, now)``); the script is given the
    floor ``t - B``, as the store gives it, and must store ``gcra_update``'s value."""
    t = float(T0 + at)
    db.delete(KEY)
    value = None if previous is None else float(T0 + previous)
    if value is not None:
        db.set(KEY, repr(value))
    floor = t - rule.burst * rule.interval_ms
    expire = math.ceil(t + rule.window_ms)
    assert db.eval(_WRITE_LUA, 0, _LEN(len(KEY)) + KEY + _OP(floor, rule.interval_ms, expire)) == 1
    stored = db.get(KEY)
    assert stored is not None
    assert float(stored) == gcra_update(value, t, t, rule).value
    assert db.pexpiretime(KEY.decode()) == expire
