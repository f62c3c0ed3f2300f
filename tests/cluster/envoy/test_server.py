"""envoyproxy/ratelimit's server tests (test/server/health_test.go, server_impl_test.go's
TestJsonHandler) against real ``smockron cluster`` processes in envoyproxy/ratelimit mode:
``GET /healthcheck`` and the gRPC health service ``ratelimit`` follow Redis and the loaded
configuration; ``POST /json`` answers as upstream's JSON handler."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.cluster.envoy.conftest import StartNode, UpstreamNode, request
from tests.support import RedisServer, free_port, wait_for

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def http(node: UpstreamNode, path: str, body: bytes | None = None) -> tuple[int, str, str]:
    """``(status, content type, body)`` of a GET (or a POST of ``body``)."""
    url = f"http://127.0.0.1:{node.http_port}{path}"
    req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read().decode()


def healthcheck(node: UpstreamNode) -> int:
    return http(node, "/healthcheck")[0]


def grpc_health(node: UpstreamNode, service: str = "ratelimit") -> int:
    with grpc.insecure_channel(node.grpc_address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    return int(answer.status)


def redis_env(port: int, **more: str) -> dict[str, str]:
    return {
        "BACKEND_TYPE": "redis",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": f"127.0.0.1:{port}",
        **more,
    }


def test_health_check(upstream_node: StartNode, tmp_path: Path) -> None:
    """TestHealthCheck: unhealthy (500) until Redis answers; with
    REDIS_HEALTH_CHECK_ACTIVE_CONNECTION, unhealthy again while Redis is down."""
    redis_server = RedisServer(free_port(), tmp_path)
    node = upstream_node(redis_env(redis_server.port, REDIS_HEALTH_CHECK_ACTIVE_CONNECTION="true"))
    try:
        assert healthcheck(node) == 500
        redis_server.start()
        wait_for(lambda: healthcheck(node) == 200)
        assert http(node, "/healthcheck")[2] == "OK"
        redis_server.stop()
        wait_for(lambda: healthcheck(node) == 500)
        redis_server.start()
        wait_for(lambda: healthcheck(node) == 200)
    finally:
        redis_server.stop()


def test_grpc_health_check(upstream_node: StartNode, tmp_path: Path) -> None:
    """TestGrpcHealthCheck: the service ``ratelimit`` on the gRPC port, NOT_SERVING until
    Redis answers; ``""`` is always SERVING; another name is NOT_FOUND."""
    redis_server = RedisServer(free_port(), tmp_path)
    node = upstream_node(redis_env(redis_server.port, REDIS_HEALTH_CHECK_ACTIVE_CONNECTION="true"))
    try:
        assert grpc_health(node) == NOT_SERVING
        assert grpc_health(node, "") == SERVING
        redis_server.start()
        wait_for(lambda: grpc_health(node) == SERVING)
        redis_server.stop()
        wait_for(lambda: grpc_health(node) == NOT_SERVING)
    finally:
        redis_server.stop()
    try:
        grpc_health(node, "gubernator")
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.NOT_FOUND
    else:
        raise AssertionError("an unknown service name was answered")


def test_healthy_with_at_least_one_config_loaded(
    upstream_node: StartNode, redis_server: RedisServer, tmp_path: Path
) -> None:
    """TestHealthyWithAtLeastOneConfigLoaded and its gRPC twin: with
    HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, Redis up is not enough: a loaded domain is."""
    runtime = tmp_path / "rt" / "ratelimit"
    (runtime / "config").mkdir(parents=True)
    node = upstream_node(
        redis_env(redis_server.port, HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED="true"),
        runtime=runtime,
    )
    assert healthcheck(node) == 500
    assert grpc_health(node) == NOT_SERVING
    (runtime / "config" / "a.yaml").write_text(
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
    )
    wait_for(lambda: healthcheck(node) == 200)
    assert grpc_health(node) == SERVING
    (runtime / "config" / "a.yaml").unlink()
    wait_for(lambda: healthcheck(node) == 500)
    assert grpc_health(node) == NOT_SERVING


def test_healthy_without_the_setting_even_with_no_domain(
    upstream_node: StartNode, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Without HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED an empty runtime directory is
    healthy once Redis answers (upstream's default)."""
    runtime = tmp_path / "rt" / "ratelimit"
    (runtime / "config").mkdir(parents=True)
    node = upstream_node(redis_env(redis_server.port), runtime=runtime)
    wait_for(lambda: healthcheck(node) == 200)


def test_json_handler(upstream_node: StartNode, redis_server: RedisServer) -> None:
    """TestJsonHandler: the cases a real service can produce (upstream's mock also
    returns an UNKNOWN code and a nil answer, which a real service does not)."""
    node = upstream_node(redis_env(redis_server.port))
    bad = (400, "text/plain; charset=utf-8", "Bad Request\n")
    assert http(node, "/json", b"") == bad  # missing request body
    assert http(node, "/json", b"}") == bad  # not JSON
    assert http(node, "/json", b'{"domain": "foo"}') == bad  # the service fails the call
    assert http(node, "/json", b'{"domain": "foo", "colour": 1}') == bad  # unknown field
    body = b'{"domain": "basic", "descriptors": [{"entries": [{"key": "one_per_minute"}]}]}'
    status, kind, text = http(node, "/json", body)
    assert (status, kind) == (200, "application/json; charset=utf-8")
    answer = json.loads(text)
    assert answer["overallCode"] == "OK"
    assert answer["statuses"][0]["currentLimit"] == {"requestsPerUnit": 1, "unit": "MINUTE"}
    status, kind, text = http(node, "/json", body)
    assert (status, kind) == (429, "application/json; charset=utf-8")
    assert json.loads(text)["overallCode"] == "OVER_LIMIT"
    status, _, text = http(
        node,
        "/json",
        b'{"domain": "foo", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}',
    )
    assert status == 200
    assert json.loads(text) == {"overallCode": "OK", "statuses": [{"code": "OK"}]}
    url = f"http://127.0.0.1:{node.gateway_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        metrics = resp.read().decode()
    assert "smockron_envoy_json_malformed_total 3.0" in metrics  # "", "}", the unknown field


async def test_sigterm_fails_the_health_check_while_calls_are_served(
    upstream_node: StartNode, redis_server: RedisServer
) -> None:
    """Upstream's ``sigterm`` component: from SIGTERM on the node is unhealthy; with
    GUBER_GRACEFUL_TERMINATION_DELAY_SEC it still answers calls meanwhile."""
    env = redis_env(redis_server.port, GUBER_GRACEFUL_TERMINATION_DELAY_SEC="3")
    node = upstream_node(env)
    wait_for(lambda: healthcheck(node) == 200)
    node.proc.popen.send_signal(signal.SIGTERM)
    wait_for(lambda: healthcheck(node) == 500)
    assert grpc_health(node) == NOT_SERVING
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        resp = await node.stub(channel).ShouldRateLimit(
            request("basic", [[("key1", "foo")]]), timeout=10
        )
    assert resp.statuses[0].limit_remaining == 49
