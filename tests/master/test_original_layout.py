"""``?layout=original``: smockron's master and the original Smockron master share one Redis.

The original master here is its datastore's update, command for command: a Lua script
(ours, doing what the original's does) loaded with SCRIPT LOAD and run with EVALSHA, one
key ``throttle;<domain>;<identifier>`` and the arguments ``Math.max(ts, now)``, interval
and burst, written as JavaScript writes numbers.

Every step is checked against a reference Redis database that only the original's
script touches: same replies, same stored bytes, same expiry, whoever did the step.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from smockron.master.config import load_settings
from smockron.master.engine import Engine
from smockron.master.stores import open_store
from smockron.master.stores.original import OriginalLayoutStore, original_key
from smockron.wire.codec import ACCEPTED, DELAYED, decode_control, encode_accounting
from tests.support import RedisServer

# The original master's update of one key, as its datastore makes it (arguments
# max(ts, now), the interval and the burst in ms; the same Redis commands and number
# formatting): ``V = max(V, t - B) + I``, stored, expiring at ``t + B``. Our own script.
ORIGINAL_LUA = """
local t, i, b = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local v = tonumber(redis.call('GET', KEYS[1]))
if v == nil or v < t - b then v = t - b end
v = v + i
redis.call('SET', KEYS[1], v)
redis.call('PEXPIREAT', KEYS[1], t + b)
return v
"""

YAML = """\
datastore:
  host: "tcp://127.0.0.1:{port}"
domains:
  api:
    rate: "3/sec"
    burst: 5
"""
INTERVAL, BURST = 333, 1665  # the original's: Math.round(1000 / 3), 5 * 333


def js(number: float) -> str:
    """A number as JavaScript's String() writes it (whole numbers without ".0")."""
    return str(int(number)) if number == int(number) else repr(number)


class OriginalDatastore:
    """datastore.js's logAccess: the same Redis commands, in the same order."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.sha: str = client.script_load(ORIGINAL_LUA)

    def log_access(self, domain: str, identifier: bytes, ts: float, now: float) -> int:
        # Node's Buffer.toString() reads the identifier frame as UTF-8, U+FFFD for junk
        key = "throttle;" + domain + ";" + identifier.decode("utf-8", "replace")
        reply = self.client.evalsha(self.sha, 1, key, js(max(ts, now)), js(INTERVAL), js(BURST))
        return int(reply)


class Smockron:
    """smockron's master: engine and store as the server runs them, one batch a step."""

    def __init__(self, tmp_path: Path, server: RedisServer) -> None:
        path = tmp_path / "master.yaml"
        path.write_text(YAML.format(port=server.port))
        settings = load_settings(path, overrides={"store": None})
        self.uri = settings.store + "?layout=original"
        store = open_store(self.uri)
        assert isinstance(store, OriginalLayoutStore)
        self.store = store
        self.engine = Engine(settings.domains, store)

    async def step(self, frames: list[bytes], now: float) -> list[int]:
        self.store.tick(now)
        decoded = self.engine.decode([frames])
        await self.store.load(self.engine.touched(decoded))
        out = self.engine.apply(decoded, now)
        await self.store.flush(wait=False)  # as the server does; the next load waits
        await self.store.drain()
        return [decode_control(c).until_ms for c in out]


@pytest.fixture
def clients(redis_server: RedisServer) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    shared = redis.Redis(port=redis_server.port, db=0)
    reference = redis.Redis(port=redis_server.port, db=1)
    try:
        yield shared, reference
    finally:
        shared.close()
        reference.close()


def pexpiretime(client: redis.Redis, key: bytes | str) -> int:
    """PEXPIRETIME of a key given as Redis returns it (bytes; redis-py's stubs say str)."""
    return int(client.pexpiretime(key))  # type: ignore[arg-type]


def expire_passed(client: redis.Redis, now: float) -> None:
    """What Redis does when its clock passes a key's PEXPIREAT, at the test's clock."""
    for key in client.keys("throttle;*"):
        if 0 <= pexpiretime(client, key) < now:  # Redis: expired once past it
            client.delete(key)


IDENTIFIERS = (b"10.0.0.1", b"10.0.0.2", "caf\u00e9".encode(), b"bad\xffutf8")


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_both_masters_see_each_others_state(
    tmp_path: Path,
    redis_server: RedisServer,
    clients: tuple[redis.Redis, redis.Redis],
    seed: int,
) -> None:
    """Accounting goes at random to the original (its script on the shared database) or
    to smockron's master; the same traffic goes to the original alone on a reference
    database. After every message: the same DELAY_UNTIL, and every key the same bytes
    and the same expiry in both databases."""
    shared, reference = clients
    original, alone = OriginalDatastore(shared), OriginalDatastore(reference)
    ours = Smockron(tmp_path, redis_server)
    rng = random.Random(seed)
    now = 4_000_000_000_000.0  # the year 2096: Redis's own clock expires nothing
    steps = {"original": 0, "smockron": 0}
    try:
        for _ in range(400):
            now += rng.choice((0, 0, 1, 50, INTERVAL, INTERVAL * 2, BURST * 3))
            expire_passed(shared, now)
            expire_passed(reference, now)
            ident = rng.choice(IDENTIFIERS)
            key = "throttle;api;" + ident.decode("utf-8", "replace")
            held = reference.get(key)
            if held is not None and float(held) > now:  # held until its DELAY_UNTIL
                ts = float(held)
                frames = encode_accounting("api", DELAYED, ident, int(now), int(ts))
            else:
                ts = now - rng.choice((0, 1, 20))
                frames = encode_accounting("api", ACCEPTED, ident, int(ts))
            new = alone.log_access("api", ident, ts, now)
            expected = [new] if new > now else []
            if rng.random() < 0.5:
                steps["original"] += 1
                mine = original.log_access("api", ident, ts, now)
                assert ([mine] if mine > now else []) == expected
            else:
                steps["smockron"] += 1
                assert await ours.step(frames, now) == expected
            for k in reference.keys("throttle;*") + shared.keys("throttle;*"):
                assert shared.get(k) == reference.get(k), k
                assert pexpiretime(shared, k) == pexpiretime(reference, k), k
        assert min(steps.values()) > 150
    finally:
        await ours.store.close()


async def test_keys_values_and_expiry_are_the_originals(
    tmp_path: Path, redis_server: RedisServer, clients: tuple[redis.Redis, redis.Redis]
) -> None:
    """What smockron's master writes, byte for byte: the key, the decimal value, the
    PEXPIREAT; and nothing else in the database."""
    shared, _reference = clients
    ours = Smockron(tmp_path, redis_server)
    now = 4_000_000_000_000.0
    try:
        assert await ours.step(encode_accounting("api", ACCEPTED, b"1.2.3.4", int(now)), now) == []
        assert shared.keys("*") == [b"throttle;api;1.2.3.4"]
        assert shared.get(b"throttle;api;1.2.3.4") == b"%d" % (now - BURST + INTERVAL)
        assert pexpiretime(shared, b"throttle;api;1.2.3.4") == now + BURST
        assert original_key("api", b"caf\xc3\xa9") == "throttle;api;caf\u00e9".encode()
        assert original_key("api", b"x\xff") == "throttle;api;x\ufffd".encode()
    finally:
        await ours.store.close()


async def test_reads_what_the_original_wrote(
    tmp_path: Path, redis_server: RedisServer, clients: tuple[redis.Redis, redis.Redis]
) -> None:
    """Five requests through the original use the burst; the sixth, through smockron's
    master, is throttled from the original's state, and the original sees it counted."""
    shared, _reference = clients
    original = OriginalDatastore(shared)
    ours = Smockron(tmp_path, redis_server)
    now = 4_000_000_000_000.0
    try:
        replies = [original.log_access("api", b"a", now, now) for _ in range(5)]
        assert replies[-1] == now  # 5 * 333 - 1665: the burst is used up, not exceeded
        frames = encode_accounting("api", ACCEPTED, b"a", int(now))
        assert await ours.step(frames, now) == [now + INTERVAL]
        assert original.log_access("api", b"a", now, now) == now + 2 * INTERVAL
    finally:
        await ours.store.close()


def test_layout_option_and_bad_uris() -> None:
    from smockron.errors import ConfigError

    store = open_store("redis://127.0.0.1:1/0?layout=original&socket_timeout=2")
    assert isinstance(store, OriginalLayoutStore)
    kwargs = store.client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 2.0 and "layout" not in kwargs
    for uri, words in [
        ("redis://tcp://127.0.0.1:6379/0", "URI inside a URI"),
        ("redis://127.0.0.1:x/0", "port 'x' is not a number"),
        ("redis:///0", "names no host"),
        ("redis://h:6379/zero", "database 'zero'"),
        ("redis://h:6379/0?layout=new", "unknown layout 'new'"),
        ("memory://x", "memory:// takes no"),
    ]:
        with pytest.raises(ConfigError, match=words) as info:
            open_store(uri)
        assert uri in str(info.value)
