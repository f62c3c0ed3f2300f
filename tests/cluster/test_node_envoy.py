"""``smockron cluster --envoy-config``: Envoy's RLS on the node's gRPC port, cluster-wide counts."""

from __future__ import annotations

from pathlib import Path

import grpc

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
