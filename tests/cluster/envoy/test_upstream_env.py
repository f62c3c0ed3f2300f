"""envoyproxy/ratelimit's environment variables, each on a real ``smockron cluster``
(the ports, Redis and statsd ones are in test_integration.py and test_server.py)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import grpc
import pytest
import redis

from smockron.cluster.envoy.upstream_env import UpstreamSettings, refusals, upstream_mode
from smockron.errors import ConfigError
from tests.cluster.envoy.conftest import StartNode, UpstreamNode, copy_runtime, request
from tests.support import RedisServer, free_port, wait_for

OK = 1
LIMIT = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"


def stats(node: UpstreamNode) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.debug_port}/stats", timeout=10) as r:
        lines = r.read().decode().splitlines()
    return {n: int(v) for n, _, v in (line.rpartition(": ") for line in lines)}


async def limit_of(node: UpstreamNode, domain: str = "d", key: str = "k") -> int:
    """The configured limit the node applies to ``domain``/``key`` (0: none)."""
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        resp = await node.stub(channel).ShouldRateLimit(request(domain, [[(key, "x")]]), timeout=10)
    return int(resp.statuses[0].current_limit.requests_per_unit)


def test_defaults_are_upstreams() -> None:
    """Unset variables mean what they mean to envoyproxy/ratelimit."""
    s = UpstreamSettings.from_env({})
    assert (s.http_address, s.grpc_address, s.debug_address) == (
        "0.0.0.0:8080",
        "0.0.0.0:8081",
        "0.0.0.0:6070",
    )
    assert s.config_dir == Path("/srv/runtime_data/current/config")
    assert (s.runtime_watch_root, s.runtime_ignore_dotfiles) == (True, False)
    assert (s.use_statsd, s.statsd_host, s.statsd_port) == (True, "localhost", 8125)
    assert s.stats_flush_interval_s == 10.0
    assert (s.backend_type, s.local_cache_size_in_bytes, s.expiration_jitter_max_seconds) == (
        "redis",
        0,
        300,
    )
    r = s.redis
    assert (r.socket_type, r.type, r.url, r.pool_size, r.auth, r.tls) == (
        "unix",
        "single",
        "/var/run/nutcracker/ratelimit.sock",
        10,
        "",
        False,
    )
    assert s.redis_persecond_settings.url == "/var/run/nutcracker/ratelimitpersecond.sock"


def test_bad_values_name_the_variable() -> None:
    with pytest.raises(ConfigError, match="PORT"):
        UpstreamSettings.from_env({"PORT": "http"})
    with pytest.raises(ConfigError, match="RUNTIME_WATCH_ROOT"):
        UpstreamSettings.from_env({"RUNTIME_WATCH_ROOT": "yes"})
    with pytest.raises(ConfigError, match="EXTRA_TAGS"):
        UpstreamSettings.from_env({"EXTRA_TAGS": "novalue"})
    with pytest.raises(ConfigError, match="STATS_FLUSH_INTERVAL"):
        UpstreamSettings.from_env({"STATS_FLUSH_INTERVAL": "soon"})
    assert UpstreamSettings.from_env({"EXTRA_TAGS": "a:b,c:d"}).extra_tags == {"a": "b", "c": "d"}


def test_mode() -> None:
    """envoyproxy/ratelimit mode: RUNTIME_ROOT or RUNTIME_SUBDIRECTORY, no --envoy-config."""
    assert not upstream_mode({}, "")
    assert upstream_mode({"RUNTIME_ROOT": "/data"}, "")
    assert upstream_mode({"RUNTIME_SUBDIRECTORY": "ratelimit"}, "")
    assert not upstream_mode({"RUNTIME_ROOT": "/data"}, "/etc/ratelimit")
    assert refusals({"BACKEND_TYPE": "redis", "CONFIG_TYPE": "FILE"}) == []
    assert len(refusals({"CONFIG_TYPE": "GRPC_XDS_SOTW", "USE_DOG_STATSD": "true"})) == 2
    stop = {"BACKEND_TYPE": "cluster", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true"}
    assert ["needs BACKEND_TYPE=redis" in line for line in refusals(stop)] == [True]
    assert refusals({**stop, "BACKEND_TYPE": "redis"}) == []


def test_settings_without_effect_are_named_in_the_log(upstream_node: StartNode) -> None:
    node = upstream_node(
        {"BACKEND_TYPE": "cluster", "LOCAL_CACHE_SIZE_IN_BYTES": "1000", "TRACING_ENABLED": "true"}
    )
    log = node.proc.log()
    assert "LOCAL_CACHE_SIZE_IN_BYTES has no effect with BACKEND_TYPE=cluster" in log
    assert "TRACING_ENABLED has no effect" in log


async def test_runtime_appdirectory(upstream_node: StartNode, tmp_path: Path) -> None:
    runtime = tmp_path / "rt" / "ratelimit"
    (runtime / "limits" / "nested").mkdir(parents=True)
    (runtime / "limits" / "nested" / "d.conf").write_text(LIMIT)  # any name, any depth
    node = upstream_node({"BACKEND_TYPE": "cluster", "RUNTIME_APPDIRECTORY": "limits"}, runtime)
    assert await limit_of(node) == 3


@pytest.mark.parametrize("ignore", ["false", "true"])
async def test_runtime_ignoredotfiles(
    ignore: str, upstream_node: StartNode, tmp_path: Path
) -> None:
    """A dot file (an editor's swap file) is loaded unless RUNTIME_IGNOREDOTFILES."""
    runtime = tmp_path / "rt" / "ratelimit"
    (runtime / "config").mkdir(parents=True)
    (runtime / "config" / "d.yaml").write_text(LIMIT)
    (runtime / "config" / ".d.yaml.swp").write_text("domain: [")
    env = {"BACKEND_TYPE": "cluster", "RUNTIME_IGNOREDOTFILES": ignore}
    node = upstream_node(env, runtime)
    if ignore == "true":
        assert await limit_of(node) == 3
    else:
        async with grpc.aio.insecure_channel(node.grpc_address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await node.stub(channel).ShouldRateLimit(request("d", [[("k", "x")]]), timeout=10)
        assert caught.value.details() == "no rate limit configuration loaded"


def test_log_level(upstream_node: StartNode) -> None:
    quiet = upstream_node({"BACKEND_TYPE": "cluster", "LOG_LEVEL": "error"})
    chatty = upstream_node({"BACKEND_TYPE": "cluster", "LOG_LEVEL": "debug"})
    assert "GRPC Listening" in chatty.proc.log()
    assert " DEBUG " in chatty.proc.log()
    assert "GRPC Listening" not in quiet.proc.log()
    assert "serving" in quiet.proc.log()  # the operator's line stays


def test_log_format_json(upstream_node: StartNode) -> None:
    node = upstream_node({"BACKEND_TYPE": "cluster", "LOG_FORMAT": "json", "LOG_LEVEL": "info"})
    lines = [line for line in node.proc.log().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]
    assert any("GRPC Listening" in r["msg"] for r in records)


def test_bad_log_level_stops_the_start(upstream_node: StartNode) -> None:
    node = upstream_node({"BACKEND_TYPE": "cluster", "LOG_LEVEL": "loud"}, wait=False)
    wait_for(lambda: not node.proc.alive(), timeout=15)
    assert node.proc.popen.returncode == 2
    assert "LOG_LEVEL: Could not parse log level 'loud'" in node.proc.log()


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("BACKEND_TYPE", "memcache", "memcache is not supported"),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW", "not xDS"),
        ("USE_DOG_STATSD", "true", "DogStatsD"),
        ("GRPC_UDS", "/tmp/rl.sock", "Unix socket"),
    ],
)
def test_refused_settings_stop_the_start(
    variable: str, value: str, message: str, upstream_node: StartNode
) -> None:
    """A setting smockron cannot honour stops the start with a message naming it."""
    node = upstream_node({variable: value}, wait=False)
    wait_for(lambda: not node.proc.alive(), timeout=15)
    assert node.proc.popen.returncode == 2
    log = node.proc.log()
    assert f"{variable}={value}" in log and message in log


async def test_near_limit_ratio(upstream_node: StartNode, redis_server: RedisServer) -> None:
    """NEAR_LIMIT_RATIO: hits past that share of the limit count as near_limit."""
    env = {
        "BACKEND_TYPE": "redis",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": f"127.0.0.1:{redis_server.port}",
        "NEAR_LIMIT_RATIO": "0.5",
    }
    node = upstream_node(env)
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        for _ in range(7):  # key3: 10 an hour, near from the 6th hit
            await node.stub(channel).ShouldRateLimit(
                request("another", [[("key3", "near")]]), timeout=5
            )
    assert stats(node)["ratelimit.service.rate_limit.another.key3.near_limit"] == 2


async def test_backend_cluster_keeps_redis_untouched(
    upstream_node: StartNode, redis_server: RedisServer
) -> None:
    """BACKEND_TYPE=cluster: smockron's own counts (REDIS_URL is not used)."""
    env = {
        "BACKEND_TYPE": "cluster",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": f"127.0.0.1:{redis_server.port}",
    }
    node = upstream_node(env)
    codes = []
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        for _ in range(2):
            resp = await node.stub(channel).ShouldRateLimit(
                request("basic", [[("one_per_minute", "x")]]), timeout=5
            )
            codes.append(resp.overall_code)
    assert codes == [OK, 2]
    assert redis.Redis(port=redis_server.port).dbsize() == 0


@pytest.mark.parametrize("milliseconds", [False, True])
async def test_use_prometheus(upstream_node: StartNode, milliseconds: bool) -> None:
    """USE_PROMETHEUS with PROMETHEUS_ADDR: /metrics there, upstream's mapped names, and
    the response-time histogram of the gRPC calls (its values in milliseconds with
    PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS, test_server_stats.py)."""
    port = free_port()
    env = {"BACKEND_TYPE": "cluster", "USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": f":{port}"}
    if milliseconds:
        env["PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS"] = "true"
    node = upstream_node(env)
    wait_for(lambda: node.proc.alive() and _get(port) is not None)
    assert "ratelimit_service_config_load_success_total 1.0" in (_get(port) or "")
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        for _ in range(3):
            await node.stub(channel).ShouldRateLimit(
                request("basic", [[("key1", "x")]]), timeout=10
            )
    text = _get(port) or ""
    count = 'ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"} 3.0'
    inf = 'ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",le="+Inf"}'
    assert count in text and f"{inf} 3.0" in text, text
    assert "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS has no effect" not in node.proc.log()


def _get(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return str(r.read().decode())
    except OSError:
        return None


async def test_envoy_config_wins_over_runtime_root(
    upstream_node: StartNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--envoy-config (here its variable) keeps smockron's own Envoy front: RUNTIME_* are
    ignored, with a warning, and the gRPC address is smockron's."""
    (tmp_path / "own.yaml").write_text(
        LIMIT.replace("requests_per_unit: 3", "requests_per_unit: 9")
    )
    grpc_port = free_port()
    node = upstream_node(
        {
            "SMOCKRON_CLUSTER_ENVOY_CONFIG": str(tmp_path / "own.yaml"),
            "SMOCKRON_CLUSTER_GRPC_ADDRESS": f"127.0.0.1:{grpc_port}",
        },
        runtime=copy_runtime(tmp_path / "other"),
        wait=False,
    )
    wait_for(lambda: "serving" in node.proc.log() or not node.proc.alive(), timeout=15)
    assert "RUNTIME_SUBDIRECTORY and envoyproxy/ratelimit's ports are ignored" in node.proc.log()
    node.grpc_port = grpc_port
    assert await limit_of(node) == 9


async def test_response_headers(upstream_node: StartNode, tmp_path: Path) -> None:
    """LIMIT_RESPONSE_HEADERS_ENABLED and a renamed header, in envoyproxy/ratelimit mode."""
    runtime = tmp_path / "rt" / "ratelimit"
    (runtime / "config").mkdir(parents=True)
    (runtime / "config" / "d.yaml").write_text(LIMIT)
    env = {
        "BACKEND_TYPE": "cluster",
        "LIMIT_RESPONSE_HEADERS_ENABLED": "true",
        "LIMIT_REMAINING_HEADER": "X-Left",
    }
    node = upstream_node(env, runtime)
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        resp = await node.stub(channel).ShouldRateLimit(request("d", [[("k", "x")]]), timeout=10)
    headers = {h.key: h.value for h in resp.response_headers_to_add}
    assert (headers["RateLimit-Limit"], headers["X-Left"]) == ("3", "2")
