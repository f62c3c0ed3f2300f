"""envoyproxy/ratelimit's Redis cache tests (test/redis/fixed_cache_impl_test.go) against a
real Redis, the clock injected as upstream's mock time source is.

Upstream's mock client returns whatever count a step needs (11, then 13, then 16...); here
the real counter is set to that count less the request's hits before the step, so that
the real ``INCRBY`` returns what the mock returned. Each test then checks what upstream
checks (statuses, per-limit counters) and what only a real Redis shows: the keys, their
counts and their expiry.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, cast

import pytest
import redis
import yaml

from smockron.cluster.envoy import EnvoySettings
from smockron.cluster.envoy.config import load_config
from smockron.cluster.envoy.pb import rls_pb2
from smockron.cluster.envoy.redis_cache import OverLimitCache, RedisRateLimitServicer, make_client
from smockron.cluster.envoy.upstream_env import RedisSettings, UpstreamSettings
from smockron.cluster.model import RateLimiter
from tests.cluster.envoy.conftest import request
from tests.support import RedisServer

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT
UNIT = rls_pb2.RateLimitResponse.RateLimit

CONFIG = """
domain: domain
descriptors:
  - key: key
    value: value
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    value: value2
    descriptors:
      - key: subkey2
        value: subvalue2
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: key3
    value: value3
    rate_limit: {unit: hour, requests_per_unit: 10}
    descriptors:
      - key: subkey3
        value: subvalue3
        rate_limit: {unit: day, requests_per_unit: 10}
  - key: key4
    value: value4
    rate_limit: {unit: hour, requests_per_unit: 15}
""" + "".join(  # key5..key10: per-second limits
    f"  - key: key{n}\n    value: value{n}\n"
    f"    rate_limit: {{unit: second, requests_per_unit: {per}}}\n"
    for n, per in ((5, 20), (6, 8), (7, 20), (8, 20), (9, 20), (10, 10))
)


class Cache:
    """A RedisRateLimitServicer over real Redis, at ``now`` (seconds)."""

    def __init__(
        self,
        tmp: Any,
        port: int,
        per_second_port: int | None = None,
        config: str = CONFIG,
        **up: Any,
    ) -> None:
        path = tmp / "config.yaml"
        text = config
        if up.pop("shadow", False):
            doc = yaml.safe_load(config)
            doc["descriptors"][3]["shadow_mode"] = True
            text = yaml.safe_dump(doc)
        path.write_text(text)
        self.now = 1234
        up.setdefault("expiration_jitter_max_seconds", 0)
        settings = dataclasses.replace(
            UpstreamSettings(), redis_persecond=per_second_port is not None, **up
        )
        self.servicer = RedisRateLimitServicer(
            cast(RateLimiter, None),  # the Redis backend never asks the cluster
            load_config(path),
            lambda: self.now * 1000,
            settings=EnvoySettings(),
            upstream=settings,
            client=make_client(RedisSettings(socket_type="tcp", url=f"127.0.0.1:{port}")),
            per_second_client=make_client(
                RedisSettings(socket_type="tcp", url=f"127.0.0.1:{per_second_port}")
            )
            if per_second_port is not None
            else None,
            rng=random.Random(1),
        )

    async def do_limit(
        self, descriptors: list[list[tuple[str, str]]], hits: list[int] | int = 1
    ) -> list[tuple[int, int, int, int]]:
        """``(code, requests_per_unit, unit, limit_remaining)`` per descriptor."""
        req = request("domain", descriptors, hits if isinstance(hits, int) else 0)
        if isinstance(hits, list):
            for descriptor, n in zip(req.descriptors, hits, strict=True):
                descriptor.hits_addend.value = n
        response = await self.servicer.decide(req)
        return [
            (s.code, s.current_limit.requests_per_unit, s.current_limit.unit, s.limit_remaining)
            for s in response.statuses
        ]

    def stats(self, key: str) -> dict[str, int]:
        return self.servicer.limit_stats[f"domain.{key}"].as_dict()


def counts(
    total: int, over: int, near: int, within: int, local: int = 0, shadow: int = 0
) -> dict[str, int]:
    return {
        "total_hits": total,
        "over_limit": over,
        "near_limit": near,
        "within_limit": within,
        "shadow_mode": shadow,
        "over_limit_with_local_cache": local,
    }


def local_cache_stats(cache: Cache) -> tuple[int, int, int, int, int]:
    """Upstream's ``testLocalCacheStats``: every ``localcache`` gauge is there; ``(hit,
    miss, lookup, expired, entry)`` counts."""
    local = cache.servicer.local_cache
    assert local is not None
    g = local.gauges()
    assert set(g) == {
        "averageAccessTime",
        "hitCount",
        "missCount",
        "lookupCount",
        "overwriteCount",
        "evacuateCount",
        "expiredCount",
        "entryCount",
    }
    return g["hitCount"], g["missCount"], g["lookupCount"], g["expiredCount"], g["entryCount"]


def preset(client: redis.Redis, key: str, count: int) -> None:
    """Make the next INCRBY of ``key`` by ``hits`` return ``count + hits``."""
    client.set(key, count, keepttl=True)


@pytest.mark.parametrize(
    "per_second", [False, True], ids=["WithoutPerSecondRedis", "WithPerSecondRedis"]
)
async def test_redis(
    per_second: bool, tmp_path: Any, redis_server: RedisServer, per_second_redis: RedisServer
) -> None:
    """TestRedis: upstream's keys, counts and expiry, second limits in their own Redis."""
    cache = Cache(tmp_path, redis_server.port, per_second_redis.port if per_second else None)
    main = redis.Redis(port=redis_server.port, decode_responses=True)
    seconds = redis.Redis(port=per_second_redis.port, decode_responses=True)
    used = seconds if per_second else main
    preset(used, "domain_key_value_1234", 4)
    assert await cache.do_limit([[("key", "value")]]) == [(OK, 10, UNIT.SECOND, 5)]
    assert cache.stats("key_value") == counts(1, 0, 0, 1)
    assert used.get("domain_key_value_1234") == "5"
    assert used.ttl("domain_key_value_1234") == 1  # EXPIRE key 1 (no jitter)
    if per_second:
        assert main.keys("*") == []

    preset(main, "domain_key2_value2_subkey2_subvalue2_1200", 10)
    answer = await cache.do_limit(
        [[("key2", "value2")], [("key2", "value2"), ("subkey2", "subvalue2")]], [0, 1]
    )
    assert answer == [(OK, 0, 0, 0), (OVER, 10, UNIT.MINUTE, 0)]
    assert cache.stats("key2_value2.subkey2_subvalue2") == counts(1, 1, 0, 0)
    assert main.get("domain_key2_value2_subkey2_subvalue2_1200") == "11"
    assert 0 < main.ttl("domain_key2_value2_subkey2_subvalue2_1200") <= 60

    cache.now = 1_000_000
    preset(main, "domain_key3_value3_997200", 11)
    preset(main, "domain_key3_value3_subkey3_subvalue3_950400", 12)
    answer = await cache.do_limit(
        [[("key3", "value3")], [("key3", "value3"), ("subkey3", "subvalue3")]], [0, 1]
    )
    assert answer == [(OVER, 10, UNIT.HOUR, 0), (OVER, 10, UNIT.DAY, 0)]
    assert main.get("domain_key3_value3_997200") == "11"  # INCRBY 0
    assert main.get("domain_key3_value3_subkey3_subvalue3_950400") == "13"
    assert 3500 < main.ttl("domain_key3_value3_997200") <= 3600
    assert 86300 < main.ttl("domain_key3_value3_subkey3_subvalue3_950400") <= 86400


async def over_limit_with_local_cache(cache: Cache, main: redis.Redis, shadow: bool) -> None:
    """TestOverLimitWithLocalCache and its shadow-rule twin."""
    key = "domain_key4_value4_997200"
    code_over = OK if shadow else OVER
    preset(main, key, 10)
    assert await cache.do_limit([[("key4", "value4")]]) == [(OK, 15, UNIT.HOUR, 4)]
    assert cache.stats("key4_value4") == counts(1, 0, 0, 1)
    assert local_cache_stats(cache) == (0, 1, 1, 0, 0)
    preset(main, key, 12)
    assert await cache.do_limit([[("key4", "value4")]]) == [(OK, 15, UNIT.HOUR, 2)]
    assert cache.stats("key4_value4") == counts(2, 0, 1, 2)
    assert local_cache_stats(cache) == (0, 2, 2, 0, 0)
    preset(main, key, 15)
    assert await cache.do_limit([[("key4", "value4")]]) == [(code_over, 15, UNIT.HOUR, 0)]
    assert cache.stats("key4_value4") == counts(3, 1, 1, 2, shadow=int(shadow))
    assert local_cache_stats(cache) == (0, 3, 3, 0, 1)
    # over the limit in the local cache: Redis is not asked
    assert await cache.do_limit([[("key4", "value4")]]) == [(code_over, 15, UNIT.HOUR, 0)]
    assert cache.stats("key4_value4") == counts(4, 2, 1, 2, local=1, shadow=2 * shadow)
    assert local_cache_stats(cache) == (1, 3, 4, 0, 1)
    assert main.get(key) == "16"


@pytest.mark.parametrize("shadow", [False, True], ids=["", "shadow_rule"])
async def test_over_limit_with_local_cache(
    shadow: bool, tmp_path: Any, redis_server: RedisServer
) -> None:
    """TestOverLimitWithLocalCache and TestOverLimitWithLocalCacheShadowRule."""
    cache = Cache(tmp_path, redis_server.port, local_cache_size_in_bytes=100, shadow=shadow)
    cache.now = 1_000_000
    await over_limit_with_local_cache(
        cache, redis.Redis(port=redis_server.port, decode_responses=True), shadow
    )


async def test_near_limit(tmp_path: Any, redis_server: RedisServer) -> None:
    """TestNearLimit: the near_limit counter, with upstream's float32 threshold."""
    cache = Cache(tmp_path, redis_server.port)
    main = redis.Redis(port=redis_server.port)
    cache.now = 1_000_000
    for preset_to, remaining, code, stats in (
        (10, 4, OK, counts(1, 0, 0, 1)),
        (12, 2, OK, counts(2, 0, 1, 2)),
        (15, 0, OVER, counts(3, 1, 1, 2)),  # over: near_limit does not move
    ):
        preset(main, "domain_key4_value4_997200", preset_to)
        assert await cache.do_limit([[("key4", "value4")]]) == [(code, 15, UNIT.HOUR, remaining)]
        assert cache.stats("key4_value4") == stats
    cache.now = 1234
    for key, hits, after, limit, code, remaining, stats in (
        ("key5", 3, 5, 20, OK, 15, counts(3, 0, 0, 3)),
        ("key6", 2, 7, 8, OK, 1, counts(2, 0, 1, 2)),
        ("key7", 3, 19, 20, OK, 1, counts(3, 0, 3, 3)),
        ("key8", 3, 22, 20, OVER, 0, counts(3, 2, 1, 0)),
        ("key9", 7, 22, 20, OVER, 0, counts(7, 2, 4, 0)),
        ("key10", 3, 30, 10, OVER, 0, counts(3, 3, 0, 0)),
    ):
        value = key.replace("key", "value")
        preset(main, f"domain_{key}_{value}_1234", after - hits)
        answer = await cache.do_limit([[(key, value)]], hits)
        assert answer == [(code, limit, UNIT.SECOND, remaining)], key
        assert cache.stats(f"{key}_{value}") == stats, key


async def test_redis_with_jitter(tmp_path: Any, redis_server: RedisServer) -> None:
    """TestRedisWithJitter: EXPIRE is the window plus up to EXPIRATION_JITTER_MAX_SECONDS."""
    cache = Cache(tmp_path, redis_server.port, expiration_jitter_max_seconds=3600)
    main = redis.Redis(port=redis_server.port)
    preset(main, "domain_key_value_1234", 4)
    assert await cache.do_limit([[("key", "value")]]) == [(OK, 10, UNIT.SECOND, 5)]
    assert cache.stats("key_value") == counts(1, 0, 0, 1)
    ttl = main.ttl("domain_key_value_1234")
    assert 1 < ttl <= 3600, ttl  # 1 s window + jitter in [0, 3600)


async def test_over_limit_with_stop_cache_key_increment_when_overlimit_config(
    tmp_path: Any, redis_server: RedisServer
) -> None:
    """TestOverLimitWithStopCacheKeyIncrementWhenOverlimitConfig: counts read first; when
    one counter would go over, only that one is incremented."""
    text = CONFIG.replace(
        "  - key: key5\n    value: value5\n    rate_limit: {unit: second, requests_per_unit: 20}",
        "  - key: key5\n    value: value5\n    rate_limit: {unit: hour, requests_per_unit: 14}",
    )
    cache = Cache(
        tmp_path,
        redis_server.port,
        config=text,
        local_cache_size_in_bytes=100,
        stop_cache_key_increment_when_overlimit=True,
    )
    main = redis.Redis(port=redis_server.port, decode_responses=True)
    cache.now = 1_000_000
    k4, k5 = "domain_key4_value4_997200", "domain_key5_value5_997200"
    preset(main, k4, 10)
    preset(main, k5, 10)
    both = [[("key4", "value4")], [("key5", "value5")]]
    assert await cache.do_limit(both, [1, 1]) == [(OK, 15, UNIT.HOUR, 4), (OK, 14, UNIT.HOUR, 3)]
    assert cache.stats("key4_value4") == counts(1, 0, 0, 1)
    assert cache.stats("key5_value5") == counts(1, 0, 0, 1)
    assert local_cache_stats(cache) == (0, 2, 2, 0, 0)
    assert await cache.do_limit(both, [2, 2]) == [(OK, 15, UNIT.HOUR, 2), (OK, 14, UNIT.HOUR, 1)]
    assert cache.stats("key4_value4") == counts(3, 0, 1, 3)
    assert cache.stats("key5_value5") == counts(3, 0, 2, 3)
    assert local_cache_stats(cache) == (0, 4, 4, 0, 0)
    answer = await cache.do_limit(both, [2, 2])
    assert answer == [(OK, 15, UNIT.HOUR, 2), (OVER, 14, UNIT.HOUR, 0)]
    assert (main.get(k4), main.get(k5)) == ("13", "15")  # key4 not incremented
    assert cache.stats("key4_value4") == counts(5, 0, 2, 5)
    assert cache.stats("key5_value5") == counts(5, 1, 3, 3)
    assert local_cache_stats(cache) == (0, 6, 6, 0, 1)


def test_local_cache_gauges_expiry_room_overwrite() -> None:
    """freecache's other counters: expired (a key found expired, or dropped for room after
    its expiry), evacuated (dropped for room before it), overwrites, and the mean of the
    entries' last access times."""
    mono, wall = [0.0], [1000.0]
    cache = OverLimitCache(0, clock=lambda: mono[0], wall=lambda: wall[0])
    length = 150_000 - cache.ENTRY_OVERHEAD  # three fit in freecache's 512 KiB, not four
    a, b, c, d, e = (ch * length for ch in "abcde")
    cache.add(a, 10)
    wall[0] = 1010
    cache.add(b, 100)
    assert cache.gauges()["averageAccessTime"] == 1005
    mono[0], wall[0] = 5, 1020
    assert a in cache  # a hit is an access
    assert cache.gauges()["averageAccessTime"] == 1015
    wall[0] = 1030
    cache.add(b, 100)  # b again: overwritten in place
    cache.add(c, 100)
    assert cache.gauges()["averageAccessTime"] == (1020 + 1030 + 1030) // 3
    mono[0], wall[0] = 20, 1040
    cache.add(d, 100)  # room: a goes, expired
    cache.add(e, 100)  # room: b goes, not expired: evacuated
    mono[0] = 200
    assert c not in cache  # expired: dropped, a miss
    assert cache.gauges() == {
        "evacuateCount": 1,
        "expiredCount": 2,
        "entryCount": 2,
        "averageAccessTime": 1040,
        "hitCount": 1,
        "missCount": 1,
        "lookupCount": 2,
        "overwriteCount": 1,
    }
    assert d not in cache and e not in cache  # past their expiry too
    assert cache.gauges()["entryCount"] == cache.gauges()["averageAccessTime"] == 0
