"""envoyproxy/ratelimit's integration test (test/integration/integration_test.go), against
real ``smockron cluster`` processes started with upstream's environment and its runtime
directory, the counts in a real Redis (single, per-second pair, password, TLS, Sentinel,
Cluster). Test names are upstream's; counters are read from the debug port's ``/stats``
(upstream reads its stats store), statsd on the wire in ``test_basic_config_extra_tags``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from smockron.cluster import tlsgen
from smockron.cluster.envoy.pb import rls_pb2
from tests.cluster.envoy.conftest import StartNode, StatsdListener, UpstreamNode, request
from tests.support import RedisServer, free_port, wait_for, wait_port

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT
SECOND = rls_pb2.RateLimitResponse.RateLimit.SECOND
MINUTE = rls_pb2.RateLimitResponse.RateLimit.MINUTE
HOUR = rls_pb2.RateLimitResponse.RateLimit.HOUR


def stats(node: UpstreamNode) -> dict[str, int]:
    """The node's counters, from its debug port (``name: value`` lines)."""
    url = f"http://127.0.0.1:{node.debug_port}/stats"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(": ")
        out[name] = int(value)
    return out


def status(
    s: rls_pb2.RateLimitResponse.DescriptorStatus,
) -> tuple[int, int, int, int]:
    """``(code, requests_per_unit, unit, limit_remaining)``: what upstream's
    ``newDescriptorStatus`` compares (the reset is taken from the answer itself)."""
    return (s.code, s.current_limit.requests_per_unit, s.current_limit.unit, s.limit_remaining)


async def away_from_minute_edge() -> None:
    """Minute windows: start a sequence far enough from a boundary that it stays in one."""
    into = time.time() % 60
    if into > 50:
        await asyncio.sleep(60.5 - into)


def redis_env(port: int, **more: str) -> dict[str, str]:
    return {
        "BACKEND_TYPE": "redis",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": f"127.0.0.1:{port}",
        **more,
    }


def cache_key(name: str, local: bool) -> str:
    """Upstream's ``getCacheKey``: the ``_local`` descriptors of the runtime files."""
    return f"{name}_local" if local else name


async def basic_base_config(node: UpstreamNode, stop_increment: bool = False) -> None:
    """Upstream's ``testBasicBaseConfig``."""
    local = int(node.env.get("LOCAL_CACHE_SIZE_IN_BYTES", "0")) > 0
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        stub = node.stub(channel)
        resp = await stub.ShouldRateLimit(
            request("foo", [[(cache_key("hello", local), "world")]]), timeout=5
        )
        assert resp.overall_code == OK
        assert [
            (s.code, s.HasField("current_limit"), s.limit_remaining) for s in resp.statuses
        ] == [(OK, False, 0)]

        resp = await stub.ShouldRateLimit(
            request("basic", [[(cache_key("key1", local), "foo")]]), timeout=5
        )
        assert resp.overall_code == OK
        assert [status(s) for s in resp.statuses] == [(OK, 50, SECOND, 49)]
        key1 = f"ratelimit.service.rate_limit.basic.{cache_key('key1', local)}"
        assert stats(node)[f"{key1}.total_hits"] == 1

        await away_from_minute_edge()
        value = str(random.getrandbits(62))
        key2 = f"ratelimit.service.rate_limit.another.{cache_key('key2', local)}"
        key3 = f"ratelimit.service.rate_limit.another.{cache_key('key3', local)}"
        for i in range(25):
            resp = await stub.ShouldRateLimit(
                request("another", [[(cache_key("key2", local), value)]]), timeout=5
            )
            code, remaining = (OVER, 0) if i >= 20 else (OK, 20 - (i + 1))
            assert resp.overall_code == code
            assert [status(s) for s in resp.statuses] == [(code, 20, MINUTE, remaining)], i
            counters = stats(node)
            assert counters[f"{key2}.total_hits"] == i + 1
            assert counters[f"{key2}.over_limit"] == (i - 19 if i >= 20 else 0)
            local_over = i - 20 if local and i >= 20 else 0
            assert counters[f"{key2}.over_limit_with_local_cache"] == local_over

        await away_from_minute_edge()
        value = str(random.getrandbits(62))
        for i in range(15):
            resp = await stub.ShouldRateLimit(
                request(
                    "another",
                    [[(cache_key("key2", local), value)], [(cache_key("key3", local), value)]],
                ),
                timeout=5,
            )
            code, remaining1, remaining2 = OK, 20 - (i + 1), 10 - (i + 1)
            if i >= 10:
                code, remaining2 = OVER, 0
                if stop_increment:  # the other key stops counting once one is over
                    remaining1 = 10
            assert resp.overall_code == code, i
            assert [status(s) for s in resp.statuses] == [
                (OK, 20, MINUTE, remaining1),
                (code, 10, HOUR, remaining2),
            ], i
            counters = stats(node)
            assert counters[f"{key2}.total_hits"] == i + 26
            assert counters[f"{key2}.over_limit"] == 5
            assert counters[f"{key2}.over_limit_with_local_cache"] == (4 if local else 0)
            assert counters[f"{key3}.total_hits"] == i + 1
            assert counters[f"{key3}.over_limit"] == (i - 9 if i >= 10 else 0)
            local_over = i - 10 if local and i >= 10 else 0
            assert counters[f"{key3}.over_limit_with_local_cache"] == local_over


async def duration_until_reset_ticks_down(node: UpstreamNode) -> None:
    """The end of ``testBasicBaseConfig``: the reset counts down between two calls."""
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        stub = node.stub(channel)
        req = request("another", [[("key4", "durTest")]])
        first = await stub.ShouldRateLimit(req, timeout=10)
        await asyncio.sleep(2)
        second = await stub.ShouldRateLimit(req, timeout=10)
    before = first.statuses[0].duration_until_reset.seconds
    assert second.statuses[0].duration_until_reset.seconds < before


VARIANTS = {
    "WithoutPerSecondRedis": {},
    "WithPerSecondRedis": {"REDIS_PERSECOND": "true"},
    "WithoutPerSecondRedisWithLocalCache": {"LOCAL_CACHE_SIZE_IN_BYTES": "1000"},
    "WithPerSecondRedisWithLocalCache": {
        "REDIS_PERSECOND": "true",
        "LOCAL_CACHE_SIZE_IN_BYTES": "1000",
    },
    "WithoutPerSecondRedisWithCachePrefix": {"CACHE_KEY_PREFIX": "prefix:"},
    "WithoutPerSecondRedisWithstopCacheKeyIncrementWhenOverlimitConfig": {
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true"
    },
    "WithPerSecondRedisWithLocalCacheAndstopCacheKeyIncrementWhenOverlimitConfig": {
        "REDIS_PERSECOND": "true",
        "LOCAL_CACHE_SIZE_IN_BYTES": "1000",
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true",
    },
}


@pytest.mark.parametrize("variant", list(VARIANTS))
async def test_basic_config(
    variant: str,
    upstream_node: StartNode,
    redis_server: RedisServer,
    per_second_redis: RedisServer,
) -> None:
    """TestBasicConfig: each of upstream's Redis variants; the counters land where
    upstream's would (per-second Redis for second limits, the key prefix)."""
    env = redis_env(redis_server.port, **VARIANTS[variant])
    env["REDIS_PERSECOND_SOCKET_TYPE"] = "tcp"
    env["REDIS_PERSECOND_URL"] = f"127.0.0.1:{per_second_redis.port}"
    node = upstream_node(env)
    await basic_base_config(node, "STOP_CACHE_KEY" in str(VARIANTS[variant]))
    main = redis.Redis(port=redis_server.port, decode_responses=True)
    per_second = redis.Redis(port=per_second_redis.port, decode_responses=True)
    prefix = env.get("CACHE_KEY_PREFIX", "")
    local = "LOCAL_CACHE" in str(VARIANTS[variant])
    second_keys: list[str] = per_second.keys("*")  # type: ignore[assignment]
    main_keys: list[str] = main.keys("*")  # type: ignore[assignment]
    key1 = f"{prefix}basic_{cache_key('key1', local)}_foo_"
    holder, other = (second_keys, main_keys) if "WithPerSecond" in variant else (main_keys, [])
    assert [k for k in holder if k.startswith(key1)], holder
    assert not [k for k in other if k.startswith(key1)]
    assert all(k.startswith(prefix) for k in main_keys + second_keys)
    assert [k for k in main_keys if k.startswith(f"{prefix}another_{cache_key('key3', local)}_")]


async def test_basic_config_duration_until_reset(
    upstream_node: StartNode, redis_server: RedisServer
) -> None:
    """The duration-until-reset check of testBasicBaseConfig (once: it sleeps 2 s)."""
    node = upstream_node(redis_env(redis_server.port))
    await duration_until_reset_ticks_down(node)


async def test_basic_config_extra_tags(
    upstream_node: StartNode, redis_server: RedisServer, statsd_listener: StatsdListener
) -> None:
    """TestBasicConfig_ExtraTags: the counters reach statsd (USE_STATSD, STATSD_HOST,
    STATSD_PORT) with EXTRA_TAGS appended as upstream's stats library appends tags."""
    env = redis_env(
        redis_server.port,
        USE_STATSD="true",
        STATSD_HOST="127.0.0.1",
        STATSD_PORT=str(statsd_listener.port),
        STATS_FLUSH_INTERVAL="100ms",
        EXTRA_TAGS="foo:bar,a:b",
    )
    node = upstream_node(env)
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        await node.stub(channel).ShouldRateLimit(request("basic", [[("key1", "foo")]]), timeout=10)
    hits = "ratelimit.service.rate_limit.basic.key1.total_hits.__a=b.__foo=bar"
    loads = "ratelimit.service.config_load_success.__a=b.__foo=bar"
    wait_for(lambda: statsd_listener.get(hits) == 1 and statsd_listener.get(loads) == 1)
    calls = "ratelimit_server.ShouldRateLimit.total_requests.__a=b.__foo=bar"
    assert statsd_listener.get(calls) == 1
    await asyncio.sleep(0.5)  # later flushes send only what changed
    assert statsd_listener.get(hits) == 1
    assert statsd_listener.count("ratelimit.localcache.") == 0  # no LOCAL_CACHE_SIZE_IN_BYTES


def statsd_env(redis_port: int, statsd_port: int, **more: str) -> dict[str, str]:
    return redis_env(
        redis_port,
        USE_STATSD="true",
        STATSD_HOST="127.0.0.1",
        STATSD_PORT=str(statsd_port),
        STATS_FLUSH_INTERVAL="100ms",
        **more,
    )


async def test_statsd_response_time(
    upstream_node: StartNode, redis_server: RedisServer, statsd_listener: StatsdListener
) -> None:
    """Upstream's gRPC interceptor stats: ``ratelimit_server.<method>.total_requests`` and
    a ``response_time`` timer value (whole milliseconds) per gRPC call, ShouldRateLimit
    and the health Check; ``POST /json`` is not a gRPC call and is not counted."""
    node = upstream_node(statsd_env(redis_server.port, statsd_listener.port, EXTRA_TAGS="a:b"))
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        for _ in range(3):
            await node.stub(channel).ShouldRateLimit(
                request("basic", [[("key1", "foo")]]), timeout=10
            )
        health = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
        await health.Check(health_pb2.HealthCheckRequest(service="ratelimit"), timeout=10)
    body = b'{"domain": "basic", "descriptors": [{"entries": [{"key": "key1", "value": "foo"}]}]}'
    url = f"http://127.0.0.1:{node.http_port}/json"
    with urllib.request.urlopen(urllib.request.Request(url, body), timeout=10) as resp:
        assert resp.status == 200
    should = "ratelimit_server.ShouldRateLimit"
    check = "ratelimit_server.Check"
    wait_for(lambda: len(statsd_listener.times(f"{check}.response_time.__a=b")) == 1)
    await asyncio.sleep(0.5)  # the /json call, if it were timed, would be sent by now
    times = statsd_listener.times(f"{should}.response_time.__a=b")
    assert len(times) == 3
    assert all(t == int(t) and 0 <= t < 5000 for t in times), times
    assert statsd_listener.get(f"{should}.total_requests.__a=b") == 3
    assert statsd_listener.get(f"{check}.total_requests.__a=b") == 1
    timer_line = re.compile(
        r"ratelimit_server\.(ShouldRateLimit|Check)\.response_time\.__a=b:"
        r"\d+(\.0+)?\|ms"
    )
    timer_lines = [line for line in statsd_listener.lines if "|ms" in line]
    assert len(timer_lines) == 4 and all(timer_line.fullmatch(t) for t in timer_lines)


async def test_statsd_local_cache_gauges(
    upstream_node: StartNode, redis_server: RedisServer, statsd_listener: StatsdListener
) -> None:
    """LOCAL_CACHE_SIZE_IN_BYTES: freecache's counters as upstream's
    ``ratelimit.localcache.*`` gauges, every one sent at every flush."""
    env = statsd_env(redis_server.port, statsd_listener.port, LOCAL_CACHE_SIZE_IN_BYTES="1000")
    node = upstream_node(env)
    await away_from_minute_edge()
    start = time.time()
    value = str(random.getrandbits(62))
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        for i in range(22):  # 20 within the limit, 1 over from Redis, 1 from the local cache
            resp = await node.stub(channel).ShouldRateLimit(
                request("another", [[("key2_local", value)]]), timeout=10
            )
            assert resp.overall_code == (OVER if i >= 20 else OK), i
    expected = {
        "hitCount": 1,
        "missCount": 21,
        "lookupCount": 22,
        "entryCount": 1,
        "overwriteCount": 0,
        "evacuateCount": 0,
        "expiredCount": 0,
    }
    prefix = "ratelimit.localcache."
    wait_for(lambda: statsd_listener.gauges_under(prefix).get("lookupCount") == 22)
    got = statsd_listener.gauges_under(prefix)
    access = got.pop("averageAccessTime")
    assert got == expected
    assert start - 1 <= access <= time.time() + 1
    sent = statsd_listener.count("ratelimit.localcache.hitCount:")
    wait_for(lambda: statsd_listener.count("ratelimit.localcache.hitCount:") >= sent + 2)
    assert stats(node)["ratelimit.localcache.hitCount"] == 1  # the debug port shows them too


async def test_statsd_redis_pool_stats(
    upstream_node: StartNode, redis_server: RedisServer, statsd_listener: StatsdListener
) -> None:
    """BACKEND_TYPE=redis: upstream's radix pool trace as ``ratelimit.redis_pool.*``:
    connections made (``cx_total``), closed (``cx_local_close``), open (``cx_active``);
    a Redis restart breaks the open ones, which are closed and made again."""
    node = upstream_node(statsd_env(redis_server.port, statsd_listener.port))
    prefix = "ratelimit.redis_pool."

    async def calls(n: int) -> None:
        async with grpc.aio.insecure_channel(node.grpc_address) as channel:
            for _ in range(n):
                with contextlib.suppress(grpc.aio.AioRpcError):  # a broken connection
                    await node.stub(channel).ShouldRateLimit(
                        request("basic", [[("key1", "foo")]]), timeout=10
                    )

    await calls(5)
    assert stats(node)["ratelimit.service.rate_limit.basic.key1.total_hits"] == 5  # Redis
    wait_for(lambda: statsd_listener.gauges_under(prefix).get("cx_active", 0) >= 1)
    made = statsd_listener.get(prefix + "cx_total")
    assert made >= 1 and statsd_listener.get(prefix + "cx_local_close") == 0
    redis_server.restart()
    await calls(10)
    wait_for(lambda: statsd_listener.get(prefix + "cx_local_close") >= 1)
    wait_for(lambda: statsd_listener.get(prefix + "cx_total") > made)
    debug = stats(node)
    assert debug[prefix + "cx_active"] == (
        debug[prefix + "cx_total"] - debug[prefix + "cx_local_close"]
    )


@pytest.mark.parametrize(
    "switch", [{"USE_STATSD": "false"}, {"USE_STATSD": "true", "DISABLE_STATS": "true"}]
)
async def test_statsd_off(
    switch: dict[str, str],
    upstream_node: StartNode,
    redis_server: RedisServer,
    statsd_listener: StatsdListener,
) -> None:
    """USE_STATSD=false (upstream's tests run this way) or DISABLE_STATS: nothing is sent."""
    env = redis_env(
        redis_server.port,
        **switch,
        STATSD_HOST="127.0.0.1",
        STATSD_PORT=str(statsd_listener.port),
        STATS_FLUSH_INTERVAL="100ms",
    )
    node = upstream_node(env)
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        await node.stub(channel).ShouldRateLimit(request("basic", [[("key1", "foo")]]), timeout=10)
    await asyncio.sleep(0.5)
    assert statsd_listener.lines == []


def start_redis_with(workdir: Path, *args: str) -> tuple[int, subprocess.Popen[bytes]]:
    """A redis-server with extra arguments (password, TLS, a Unix socket)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
            "--protected-mode",
            "no",
            "--port",
            str(port),
            *args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return port, proc


@pytest.fixture
def redis_with_password(tmp_path: Path) -> Iterator[int]:
    port, proc = start_redis_with(tmp_path, "--requirepass", "password123")
    try:
        wait_port(port)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


async def test_basic_auth_config(upstream_node: StartNode, redis_with_password: int) -> None:
    """TestBasicAuthConfig: REDIS_AUTH."""
    node = upstream_node(redis_env(redis_with_password, REDIS_AUTH="password123"))
    await basic_base_config(node)
    client = redis.Redis(port=redis_with_password, password="password123")
    assert client.keys("basic_key1_foo_*")


async def test_redis_url_with_credentials(
    upstream_node: StartNode, redis_with_password: int
) -> None:
    """REDIS_URL as a redis:// URL carrying the password (upstream's driver takes those)."""
    env = redis_env(redis_with_password)
    env["REDIS_URL"] = f"redis://:password123@127.0.0.1:{redis_with_password}/0"
    node = upstream_node(env)
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        resp = await node.stub(channel).ShouldRateLimit(
            request("basic", [[("key1", "url")]]), timeout=10
        )
    assert [status(s) for s in resp.statuses] == [(OK, 50, SECOND, 49)]
    assert redis.Redis(port=redis_with_password, password="password123").keys("basic_key1_url_*")


async def test_redis_auth_wrong_password(
    upstream_node: StartNode, redis_with_password: int
) -> None:
    """A wrong REDIS_AUTH: the calls fail (UNAVAILABLE: Envoy's failure_mode_deny decides)
    and count as redis_error."""
    node = upstream_node(redis_env(redis_with_password, REDIS_AUTH="nope"))
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await node.stub(channel).ShouldRateLimit(
                request("basic", [[("key1", "foo")]]), timeout=5
            )
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert stats(node)["ratelimit.service.call.should_rate_limit.redis_error"] == 1


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A redis-server on TLS only; its CA's file."""
    ca, ca_key = tlsgen.make_ca()
    cert, key = tlsgen.make_cert(ca, ca_key, ["localhost", "127.0.0.1"])
    for name, data in (("ca.pem", ca), ("redis.pem", cert), ("redis.key", key)):
        (tmp_path / name).write_bytes(data)
    tls_port = free_port()
    _, proc = start_redis_with(
        tmp_path,
        "--port",
        "0",
        "--tls-port",
        str(tls_port),
        "--tls-cert-file",
        str(tmp_path / "redis.pem"),
        "--tls-key-file",
        str(tmp_path / "redis.key"),
        "--tls-ca-cert-file",
        str(tmp_path / "ca.pem"),
        "--tls-auth-clients",
        "no",
    )
    try:
        wait_port(tls_port)
        yield tls_port, tmp_path / "ca.pem"
    finally:
        proc.terminate()
        proc.wait(10)


async def test_basic_tls_config(upstream_node: StartNode, tls_redis: tuple[int, Path]) -> None:
    """TestBasicTLSConfig: REDIS_TLS (the server verified against REDIS_TLS_CACERT)."""
    port, ca = tls_redis
    node = upstream_node(redis_env(port, REDIS_TLS="true", REDIS_TLS_CACERT=str(ca)))
    await basic_base_config(node)


async def test_unix_socket_redis(upstream_node: StartNode, tmp_path: Path) -> None:
    """REDIS_SOCKET_TYPE=unix (upstream's default) with REDIS_URL a socket path."""
    sock = tmp_path / "redis.sock"
    _, proc = start_redis_with(tmp_path, "--port", "0", "--unixsocket", str(sock))
    try:
        wait_for(sock.exists)
        node = upstream_node({"BACKEND_TYPE": "redis", "REDIS_URL": str(sock)})
        await basic_base_config(node)
        assert redis.Redis(unix_socket_path=str(sock)).keys("another_key3_*")
    finally:
        proc.terminate()
        proc.wait(10)


def sentinel_port(url: str) -> int:
    return int(url.split("://")[1].split("/")[0].rsplit(":", 1)[1])


async def test_basic_auth_config_with_redis_sentinel(
    upstream_node: StartNode, sentinel: str, redis_server: RedisServer
) -> None:
    """TestBasicAuthConfigWithRedisSentinel: REDIS_TYPE=sentinel, REDIS_URL=master,sentinels;
    the counters are in the master Sentinel names."""
    env = {
        "BACKEND_TYPE": "redis",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_TYPE": "sentinel",
        "REDIS_URL": f"mymaster,127.0.0.1:{sentinel_port(sentinel)}",
    }
    node = upstream_node(env)
    await basic_base_config(node)
    assert redis.Redis(port=redis_server.port).keys("another_key3_*")


@pytest.fixture
def sentinel_with_auth(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """A master with a password and a Sentinel with its own: ``(master, sentinel)`` ports."""
    master, master_proc = start_redis_with(tmp_path, "--requirepass", "password123")
    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\nrequirepass sentinel123\n"
        f"sentinel monitor mymaster 127.0.0.1 {master} 1\n"
        "sentinel auth-pass mymaster password123\n"
    )
    sentinel = subprocess.Popen(
        ["redis-server", str(conf), "--sentinel"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(master)
        wait_port(port)
        yield master, port
    finally:
        for proc in (sentinel, master_proc):
            proc.terminate()
            proc.wait(10)


async def test_redis_sentinel_with_auth_and_per_second(
    upstream_node: StartNode, sentinel_with_auth: tuple[int, int]
) -> None:
    """upstream's configRedisSentinel with per-second limits too: REDIS_AUTH,
    REDIS_SENTINEL_AUTH and their REDIS_PERSECOND_ twins, REDIS_PERSECOND_TYPE."""
    master, sentinel_port = sentinel_with_auth
    url = f"mymaster,127.0.0.1:{sentinel_port}"
    env = {
        "BACKEND_TYPE": "redis",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_TYPE": "sentinel",
        "REDIS_URL": url,
        "REDIS_AUTH": "password123",
        "REDIS_SENTINEL_AUTH": "sentinel123",
        "REDIS_PERSECOND": "true",
        "REDIS_PERSECOND_SOCKET_TYPE": "tcp",
        "REDIS_PERSECOND_TYPE": "sentinel",
        "REDIS_PERSECOND_URL": url,
        "REDIS_PERSECOND_AUTH": "password123",
        "REDIS_PERSECOND_SENTINEL_AUTH": "sentinel123",
    }
    node = upstream_node(env)
    await basic_base_config(node)
    client = redis.Redis(port=master, password="password123")
    assert client.keys("basic_key1_foo_*") and client.keys("another_key3_*")


async def test_basic_auth_config_with_redis_cluster(
    upstream_node: StartNode, cluster: list[int]
) -> None:
    """TestBasicAuthConfigWithRedisCluster: REDIS_TYPE=cluster; keys spread over the nodes."""
    env = {
        "BACKEND_TYPE": "redis",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_TYPE": "cluster",
        "REDIS_URL": ",".join(f"127.0.0.1:{p}" for p in cluster),
        "REDIS_POOL_SIZE": "2",
    }
    node = upstream_node(env)
    await basic_base_config(node)
    held = [redis.Redis(port=p).dbsize() for p in cluster]
    assert sum(held) >= 4, held


async def test_redis_pool_size(upstream_node: StartNode, redis_server: RedisServer) -> None:
    """REDIS_POOL_SIZE bounds the connections to Redis; calls beyond it wait for one."""
    node = upstream_node(redis_env(redis_server.port, REDIS_POOL_SIZE="2"))
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        stub = node.stub(channel)
        answers = await asyncio.gather(
            *(
                stub.ShouldRateLimit(request("basic", [[("key1", str(i))]]), timeout=10)
                for i in range(40)
            )
        )
    assert all(a.overall_code == OK for a in answers)
    clients = redis.Redis(port=redis_server.port).client_list()
    assert 1 <= len(clients) - 1 <= 2, clients  # minus this one


async def config_reload(node: UpstreamNode) -> None:
    """Upstream's ``testConfigReload``: a file added to the runtime directory is loaded;
    its removal loads again."""
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        stub = node.stub(channel)
        resp = await stub.ShouldRateLimit(request("reload", [[("block", "foo")]]), timeout=10)
        assert [(s.code, s.HasField("current_limit")) for s in resp.statuses] == [(OK, False)]
        before = stats(node)["ratelimit.service.config_load_success"]
        shutil.copy(node.runtime / "reload.yaml", node.runtime / "config" / "reload.yaml")
        wait_for(lambda: stats(node)["ratelimit.service.config_load_success"] > before, timeout=20)
        resp = await stub.ShouldRateLimit(request("reload", [[("key1", "foo")]]), timeout=10)
        assert [status(s) for s in resp.statuses] == [(OK, 50, SECOND, 49)]
        before = stats(node)["ratelimit.service.config_load_success"]
        (node.runtime / "config" / "reload.yaml").unlink()
        wait_for(lambda: stats(node)["ratelimit.service.config_load_success"] > before, timeout=20)
        resp = await stub.ShouldRateLimit(request("reload", [[("key1", "foo")]]), timeout=10)
        assert [(s.code, s.HasField("current_limit")) for s in resp.statuses] == [(OK, False)]


@pytest.mark.parametrize("watch_root", ["false", "true"])
async def test_basic_reload_config(
    watch_root: str, upstream_node: StartNode, redis_server: RedisServer
) -> None:
    """TestBasicReloadConfig: BasicWithoutWatchRoot and ReloadWithoutWatchRoot, and the
    same with RUNTIME_WATCH_ROOT=true."""
    node = upstream_node(redis_env(redis_server.port, RUNTIME_WATCH_ROOT=watch_root))
    await basic_base_config(node)
    await config_reload(node)


async def test_watch_root_follows_a_swapped_symlink(
    upstream_node: StartNode, redis_server: RedisServer, tmp_path: Path
) -> None:
    """RUNTIME_WATCH_ROOT: RUNTIME_ROOT a symlink swapped to a new tree (how upstream's
    runtime directories are deployed) loads the new tree."""
    first = tmp_path / "v1" / "ratelimit" / "config"
    first.mkdir(parents=True)
    (first / "a.yaml").write_text(
        "domain: swap\ndescriptors:\n  - key: k\n"
        "    rate_limit: {unit: hour, requests_per_unit: 5}\n"
    )
    second = tmp_path / "v2" / "ratelimit" / "config"
    second.mkdir(parents=True)
    (second / "a.yaml").write_text(
        "domain: swap\ndescriptors:\n  - key: k\n"
        "    rate_limit: {unit: hour, requests_per_unit: 7}\n"
    )
    current = tmp_path / "current"
    current.symlink_to(tmp_path / "v1")
    node = upstream_node(
        redis_env(redis_server.port, RUNTIME_WATCH_ROOT="true"), runtime=current / "ratelimit"
    )

    async def limit() -> int:
        async with grpc.aio.insecure_channel(node.grpc_address) as channel:
            resp = await node.stub(channel).ShouldRateLimit(
                request("swap", [[("k", "x")]]), timeout=5
            )
        return int(resp.statuses[0].current_limit.requests_per_unit)

    assert await limit() == 5
    stamp = (first / "a.yaml").stat().st_mtime_ns  # the same times: only the swap differs
    os.utime(second / "a.yaml", ns=(stamp, stamp))
    swap = tmp_path / "current.new"
    swap.symlink_to(tmp_path / "v2")
    swap.rename(current)
    deadline = time.monotonic() + 10
    while await limit() != 7:
        assert time.monotonic() < deadline, "the swapped tree was not loaded"
        await asyncio.sleep(0.1)


async def test_over_limit_survives_a_restart(
    upstream_node: StartNode, redis_server: RedisServer
) -> None:
    """A key over its hourly limit stays over it across a restart of the node: the count
    is in Redis, not in the process."""
    env = redis_env(redis_server.port)
    node = upstream_node(env)
    value = str(random.getrandbits(62))
    req = request("another", [[("key3", value)]])
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        codes = [
            (await node.stub(channel).ShouldRateLimit(req, timeout=10)).overall_code
            for _ in range(11)
        ]
    assert codes == [OK] * 10 + [OVER]
    assert node.proc.stop() == 0
    again = upstream_node(env, name="restarted")
    async with grpc.aio.insecure_channel(again.grpc_address) as channel:
        resp = await again.stub(channel).ShouldRateLimit(req, timeout=10)
    assert resp.overall_code == OVER
    assert [status(s) for s in resp.statuses] == [(OVER, 10, HOUR, 0)]
