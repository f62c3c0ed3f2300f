"""``smockron cluster --envoy-config``: Envoy's RLS on the node's gRPC port, cluster-wide counts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from smockron.cluster.envoy.pb import ratelimit_pb2, rls_pb2, rls_pb2_grpc
from tests.cluster.test_cluster import start_cluster

CONFIG = """
domain: edge
descriptors:
  - key: generic_key
    value: slowpath
    rate_limit: {unit: minute, requests_per_unit: 3}
"""


async def test_envoy_front_counts_once_across_nodes(tmp_path: Path) -> None:
    (tmp_path / "edge.yaml").write_text(CONFIG)
    descriptor = ratelimit_pb2.RateLimitDescriptor()
    descriptor.entries.add(key="generic_key", value="slowpath")
    request = rls_pb2.RateLimitRequest(domain="edge", descriptors=[descriptor], hits_addend=1)
    codes = []
    with start_cluster(tmp_path, "--envoy-config", str(tmp_path / "edge.yaml"), nodes=2) as c:
        for i in range(5):
            async with grpc.aio.insecure_channel(c.addresses[i % 2]) as channel:
                stub = rls_pb2_grpc.RateLimitServiceStub(channel)  # type: ignore[no-untyped-call]
                resp = await stub.ShouldRateLimit(request, timeout=5)
                codes.append(resp.overall_code)
    ok, over = rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT
    assert codes == [ok, ok, ok, over, over]


async def test_envoy_config_is_reloaded_when_the_files_change(tmp_path: Path) -> None:
    """An edited descriptor file takes effect without a restart; a broken edit is ignored."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "edge.yaml").write_text(CONFIG)
    descriptor = ratelimit_pb2.RateLimitDescriptor()
    descriptor.entries.add(key="generic_key", value="slowpath")
    request = rls_pb2.RateLimitRequest(domain="edge", descriptors=[descriptor], hits_addend=1)
    args = ("--envoy-config", str(conf), "--envoy-reload-interval", "50ms")
    with start_cluster(tmp_path, *args, nodes=1) as c:
        async with grpc.aio.insecure_channel(c.addresses[0]) as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)  # type: ignore[no-untyped-call]

            async def limit() -> int:
                resp = await stub.ShouldRateLimit(request, timeout=5)
                return int(resp.statuses[0].current_limit.requests_per_unit)

            assert await limit() == 3
            (conf / "edge.yaml").write_text(
                CONFIG.replace("requests_per_unit: 3", "requests_per_unit: 70")
            )
            deadline = asyncio.get_running_loop().time() + 5
            while await limit() != 70:
                assert asyncio.get_running_loop().time() < deadline, "config not reloaded"
                await asyncio.sleep(0.05)
            (conf / "broken.yaml").write_text("domain: [")
            await asyncio.sleep(0.3)  # several reload intervals
            assert await limit() == 70  # the running config stays
        log = c.procs[0].log()
    assert "envoy: reloaded 1 domain(s)" in log
    assert "keeping the running config" in log
    assert "Traceback" not in log


async def test_response_headers_from_envoyproxy_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "edge.yaml").write_text(CONFIG)
    monkeypatch.setenv("LIMIT_RESPONSE_HEADERS_ENABLED", "true")
    descriptor = ratelimit_pb2.RateLimitDescriptor()
    descriptor.entries.add(key="generic_key", value="slowpath")
    request = rls_pb2.RateLimitRequest(domain="edge", descriptors=[descriptor], hits_addend=1)
    with start_cluster(tmp_path, "--envoy-config", str(tmp_path / "edge.yaml"), nodes=1) as c:
        async with grpc.aio.insecure_channel(c.addresses[0]) as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)  # type: ignore[no-untyped-call]
            resp = await stub.ShouldRateLimit(request, timeout=5)
    headers = {h.key: h.value for h in resp.response_headers_to_add}
    assert headers["RateLimit-Limit"] == "3"
    assert headers["RateLimit-Remaining"] == "2"
    assert 0 < int(headers["RateLimit-Reset"]) <= 60
