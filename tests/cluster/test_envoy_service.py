"""The Envoy front on a real grpc.aio server, called through a real client stub."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY, CollectorRegistry

from smockron.cluster.envoy import (
    EnvoyConfig,
    EnvoyStatsCollector,
    RateLimitServicer,
    add_to_server,
    load_config,
)
from smockron.cluster.envoy.pb import ratelimit_pb2, ratelimit_unit_pb2, rls_pb2, rls_pb2_grpc
from smockron.cluster.local import LocalLimiter
from smockron.cluster.metrics import ClusterMetrics
from smockron.cluster.model import RateLimitRequest, RateLimitResponse

# 30 s into a minute, so minute windows have 30 s left.
T0 = int(datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC).timestamp()) * 1000
Resp = rls_pb2.RateLimitResponse
OK, OVER = Resp.OK, Resp.OVER_LIMIT

CONFIG = """
domain: edge
descriptors:
  - key: generic_key
    value: slowpath
    rate_limit: {unit: minute, requests_per_unit: 3, name: slow}
  - key: generic_key
    value: fastpath
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: shadowed
    rate_limit: {unit: minute, requests_per_unit: 1}
    shadow_mode: true
  - key: remote_address
    rate_limit: {unlimited: true}
  - key: tenant
    descriptors:
      - key: path
        value: /upload*
        rate_limit: {unit: hour, requests_per_unit: 2}
"""


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@dataclass
class Env:
    stub: rls_pb2_grpc.RateLimitServiceStub
    channel: grpc.aio.Channel
    servicer: RateLimitServicer
    clock: Clock


@pytest.fixture
def config(tmp_path: Path) -> EnvoyConfig:
    (tmp_path / "edge.yaml").write_text(CONFIG)
    return load_config([tmp_path / "edge.yaml"])


async def serve(
    limiter: object,
    config: EnvoyConfig,
    clock: Clock,
    headers: bool = False,
    metrics: ClusterMetrics | None = None,
) -> AsyncIterator[Env]:
    server = grpc.aio.server()
    servicer = add_to_server(
        server,
        limiter,  # type: ignore[arg-type]
        config,
        clock,
        response_headers=headers,
        metrics=metrics,
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Env(rls_pb2_grpc.RateLimitServiceStub(channel), channel, servicer, clock)  # type: ignore[no-untyped-call]
    finally:
        await channel.close(None)
        await server.stop(None)


@pytest.fixture
async def env(config: EnvoyConfig) -> AsyncIterator[Env]:
    clock = Clock()
    async for e in serve(LocalLimiter(clock=clock), config, clock):
        yield e


def desc(*entries: tuple[str, str], hits: int | None = None) -> ratelimit_pb2.RateLimitDescriptor:
    d = ratelimit_pb2.RateLimitDescriptor()
    for key, value in entries:
        d.entries.add(key=key, value=value)
    if hits is not None:
        d.hits_addend.value = hits
    return d


async def ask(
    env: Env, *descriptors: ratelimit_pb2.RateLimitDescriptor, hits: int = 0, domain: str = "edge"
) -> rls_pb2.RateLimitResponse:
    request = rls_pb2.RateLimitRequest(domain=domain, descriptors=descriptors, hits_addend=hits)
    response: rls_pb2.RateLimitResponse = await env.stub.ShouldRateLimit(request, timeout=5)
    return response


async def test_minute_limit_counts_down_then_over(env: Env) -> None:
    slow = desc(("generic_key", "slowpath"))
    got = [await ask(env, slow) for _ in range(4)]
    assert [r.overall_code for r in got] == [OK, OK, OK, OVER]
    assert [r.statuses[0].limit_remaining for r in got] == [2, 1, 0, 0]
    status = got[0].statuses[0]
    assert status.current_limit.requests_per_unit == 3
    assert status.current_limit.unit == Resp.RateLimit.MINUTE
    assert status.current_limit.name == "slow"
    assert status.duration_until_reset.ToMilliseconds() == 30_000
    # The next calendar minute starts a new window.
    env.clock.now = T0 + 30_000
    assert (await ask(env, slow)).overall_code == OK


async def test_statuses_follow_descriptor_order_and_any_over_is_overall_over(env: Env) -> None:
    slow, fast, unknown = (
        desc(("generic_key", "slowpath")),
        desc(("generic_key", "fastpath")),
        desc(("nothing", "here")),
    )
    await ask(env, slow, hits=3)
    r = await ask(env, fast, unknown, slow)
    assert r.overall_code == OVER
    assert [s.code for s in r.statuses] == [OK, OK, OVER]
    assert r.statuses[0].limit_remaining == 99
    assert r.statuses[0].duration_until_reset.ToMilliseconds() == 1000
    assert not r.statuses[1].HasField("current_limit")
    assert r.statuses[1].limit_remaining == 0


async def test_hits_addend_request_and_descriptor_level(env: Env) -> None:
    fast = desc(("generic_key", "fastpath"))
    assert (await ask(env, fast, hits=40)).statuses[0].limit_remaining == 60
    assert (await ask(env, desc(("generic_key", "fastpath"), hits=50), hits=40)).statuses[
        0
    ].limit_remaining == 10
    r = await ask(env, fast, hits=11)
    # Refused hits count, as in envoyproxy/ratelimit's fixed window: 0 left, and the
    # next single hit is refused too.
    assert r.overall_code == OVER and r.statuses[0].limit_remaining == 0
    assert (await ask(env, fast)).overall_code == OVER


async def test_nested_wildcard_descriptor(env: Env) -> None:
    up = desc(("tenant", "acme"), ("path", "/upload/big"))
    got = [await ask(env, up) for _ in range(3)]
    assert [r.overall_code for r in got] == [OK, OK, OVER]
    assert got[0].statuses[0].current_limit.unit == Resp.RateLimit.HOUR
    # Another tenant is another key.
    assert (await ask(env, desc(("tenant", "other"), ("path", "/upload")))).overall_code == OK
    # The parent alone has no limit.
    assert not (await ask(env, desc(("tenant", "acme")))).statuses[0].HasField("current_limit")


async def test_shadow_mode_reports_ok_but_counts(env: Env) -> None:
    shadow = desc(("shadowed", "x"))
    got = [await ask(env, shadow) for _ in range(3)]
    assert all(r.overall_code == OK for r in got)
    assert [r.statuses[0].limit_remaining for r in got] == [0, 0, 0]
    assert env.servicer.stats.shadow_over_limit == 2
    assert env.servicer.stats.over_limit == 0


async def test_unlimited(env: Env) -> None:
    r = await ask(env, desc(("remote_address", "10.0.0.1")), hits=10**6)
    assert r.overall_code == OK and r.statuses[0].limit_remaining == 2**32 - 1


async def test_limit_override_from_envoy(env: Env) -> None:
    d = desc(("not", "configured"))
    d.limit.requests_per_unit = 1
    d.limit.unit = ratelimit_unit_pb2.SECOND
    assert [(await ask(env, d)).overall_code for _ in range(2)] == [OK, OVER]


async def test_unknown_domain_is_ok(env: Env) -> None:
    r = await ask(env, desc(("generic_key", "slowpath")), domain="elsewhere")
    assert r.overall_code == OK and not r.statuses[0].HasField("current_limit")


async def test_invalid_and_malformed_requests_are_rejected_and_counted(env: Env) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await ask(env, desc(("generic_key", "slowpath")), domain="")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await ask(env)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    raw = env.channel.unary_unary(method, None, None)  # bytes in, bytes out
    for garbage in [b"\xff\xff\xff\xff", b"\x0a\x02\xff\xfe", b"\x12\x05\x0a"]:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await raw(garbage, timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert env.servicer.stats.invalid == 5
    registry = CollectorRegistry()
    registry.register(EnvoyStatsCollector(env.servicer.stats))
    assert registry.get_sample_value("smockron_envoy_invalid_total") == 5
    assert registry.get_sample_value("smockron_envoy_calls_total") == 5
    # Still serving.
    assert (await ask(env, desc(("generic_key", "slowpath")))).overall_code == OK


async def test_upstream_metrics_are_the_nodes(config: EnvoyConfig) -> None:
    """Upstream's metric names are exported on the registry of the node the servicer
    serves (two in one process count apart), never on the process's default one."""
    totals = []
    for calls in (1, 3):
        clock, metrics = Clock(), ClusterMetrics()
        async for env in serve(LocalLimiter(clock=clock), config, clock, metrics=metrics):
            for _ in range(calls):
                await ask(env, desc(("generic_key", "slowpath")))
        labels = {"grpc_method": "ShouldRateLimit"}
        totals.append(
            metrics.registry.get_sample_value("ratelimit_service_total_requests_total", labels)
        )
    assert totals == [1, 3]
    names = {m.name for m in REGISTRY.collect()}
    assert not any(name.startswith("ratelimit_service") for name in names)


class BrokenLimiter:
    def __init__(self, error: str = "") -> None:
        self.error = error

    async def get_rate_limits(
        self, requests: Sequence[RateLimitRequest]
    ) -> list[RateLimitResponse]:
        if not self.error:
            raise ConnectionError("owner unreachable")
        return [RateLimitResponse(error=self.error) for _ in requests]


async def test_limiter_failure_is_unavailable_and_item_error_fails_open(
    config: EnvoyConfig,
) -> None:
    clock = Clock()
    async for e in serve(BrokenLimiter(), config, clock):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await ask(e, desc(("generic_key", "slowpath")))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        # Descriptors without a limit never reach the limiter.
        assert (await ask(e, desc(("nothing", "x")))).overall_code == OK
    async for e in serve(BrokenLimiter("boom"), config, clock):
        r = await ask(e, desc(("generic_key", "slowpath")))
        assert r.overall_code == OK and r.statuses[0].current_limit.requests_per_unit == 3
        assert e.servicer.stats.limiter_errors == 1


async def test_concurrent_calls_never_over_admit(tmp_path: Path) -> None:
    (tmp_path / "burst.yaml").write_text(
        "domain: burst\ndescriptors:\n"
        "  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 50}\n"
    )
    clock = Clock()
    async for e in serve(LocalLimiter(clock=clock), load_config(tmp_path / "burst.yaml"), clock):
        calls = [ask(e, desc(("user", "u1")), domain="burst") for _ in range(200)]
        results = await asyncio.wait_for(asyncio.gather(*calls), timeout=30)
        codes = [r.overall_code for r in results]
        assert codes.count(OK) == 50 and codes.count(OVER) == 150
        assert e.servicer.stats.over_limit == 150


async def test_rate_limit_response_headers(config: EnvoyConfig) -> None:
    clock = Clock()
    async for e in serve(LocalLimiter(clock=clock), config, clock, headers=True):
        slow, fast = desc(("generic_key", "slowpath")), desc(("generic_key", "fastpath"))
        r = await ask(e, fast, slow)
        headers = [(h.key, h.value) for h in r.response_headers_to_add]
        # The slow limit (2 left of 3 per minute, 30 s to go) is the most constraining.
        assert headers == [
            ("RateLimit-Limit", "3"),
            ("RateLimit-Remaining", "2"),
            ("RateLimit-Reset", "30"),
        ]
        clock.now += 400  # 29.6 s left: rounded up
        r = await ask(e, slow)
        assert [h.value for h in r.response_headers_to_add] == ["3", "1", "30"]
        assert not (await ask(e, desc(("nothing", "x")))).response_headers_to_add


async def test_no_headers_unless_enabled(env: Env) -> None:
    assert not (await ask(env, desc(("generic_key", "slowpath")))).response_headers_to_add
