"""envoyproxy/ratelimit's service tests that need a whole process
(test/service/ratelimit_test.go): TestInitialLoadError, on a real ``smockron cluster``."""

from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path

import grpc
import pytest

from tests.cluster.envoy.conftest import UPSTREAM, StartNode, UpstreamNode, request
from tests.support import RedisServer, wait_for


def stats(node: UpstreamNode) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.debug_port}/stats", timeout=10) as r:
        lines = r.read().decode().splitlines()
    return {n: int(v) for n, _, v in (line.rpartition(": ") for line in lines)}


@pytest.mark.parametrize("backend", ["redis", "cluster"])
async def test_initial_load_error(
    backend: str, upstream_node: StartNode, redis_server: RedisServer, tmp_path: Path
) -> None:
    """TestInitialLoadError: files that do not load at start leave the node serving,
    every call answered "no rate limit configuration loaded" (a service error) until a
    set that loads is written."""
    runtime = tmp_path / "rt" / "ratelimit"
    (runtime / "config").mkdir(parents=True)
    (runtime / "config" / "bad.yaml").write_text("domain: [")
    env = {
        "BACKEND_TYPE": backend,
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": f"127.0.0.1:{redis_server.port}",
    }
    node = upstream_node(env, runtime=runtime)
    req = request("test-domain", [[("hello", "world")]])
    async with grpc.aio.insecure_channel(node.grpc_address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await node.stub(channel).ShouldRateLimit(req, timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNKNOWN
        assert caught.value.details() == "no rate limit configuration loaded"
        counters = stats(node)
        assert counters["ratelimit.service.call.should_rate_limit.service_error"] == 1
        assert counters["ratelimit.service.config_load_error"] == 1
        assert counters["ratelimit.service.config_load_success"] == 0
        assert node.proc.alive()

        (runtime / "config" / "bad.yaml").unlink()
        shutil.copy(UPSTREAM / "integration_runtime" / "config" / "basic.yaml", runtime / "config")
        wait_for(lambda: stats(node)["ratelimit.service.config_load_success"] == 1, timeout=20)
        resp = await node.stub(channel).ShouldRateLimit(
            request("basic", [[("key1", "foo")]]), timeout=5
        )
    assert resp.statuses[0].limit_remaining == 49
    assert "no rate limit configuration loaded" in node.proc.log()
