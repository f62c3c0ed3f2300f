"""envoyproxy/ratelimit's gRPC call stats (ServerStats): whole milliseconds, upstream's
statsd timer values and its Prometheus mapper's histogram."""

from __future__ import annotations

from collections import Counter

from prometheus_client import CollectorRegistry, generate_latest

from smockron.cluster.envoy.stats import (
    RESPONSE_BUCKETS,
    EnvoyStats,
    LimitStats,
    ServerStats,
    UpstreamMetrics,
)


class _Source:
    """What UpstreamMetrics reads of a servicer."""

    def __init__(self, server: ServerStats) -> None:
        self.stats = EnvoyStats()
        self.limit_stats: dict[str, LimitStats] = {}
        self.domain_not_found: dict[str, int] = {}
        self.server_stats: ServerStats | None = server


def test_times_are_whole_milliseconds_in_seconds_buckets() -> None:
    stats = ServerStats()
    for seconds in (0.0004, 0.0049, 0.0123, 0.0123, 0.25, 11.0):
        stats.record("ShouldRateLimit", seconds)
    stats.record("Check", 0.001)
    assert stats.total_requests == {"ShouldRateLimit": 6, "Check": 1}
    assert stats.take_times() == {
        "ShouldRateLimit": Counter({0: 1, 4: 1, 12: 2, 250: 1, 11000: 1}),
        "Check": Counter({1: 1}),
    }
    assert stats.take_times() == {}  # taken once
    counts, total = stats.histograms["ShouldRateLimit"]
    assert len(counts) == len(RESPONSE_BUCKETS) + 1
    # 0 and 4 ms <= 0.005 s; 12 ms <= 0.025; 250 ms <= 0.25 (le); 11 s above 10
    assert counts == [2, 0, 2, 0, 0, 1, 0, 0, 0, 0, 0, 1]
    assert abs(total - (0.004 + 0.024 + 0.25 + 11.0)) < 1e-9


def test_milliseconds_drop_the_scale() -> None:
    """PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS: the same buckets, milliseconds in them."""
    stats = ServerStats(milliseconds=True)
    stats.record("ShouldRateLimit", 0.004)
    stats.record("ShouldRateLimit", 0.0123)
    counts, total = stats.histograms["ShouldRateLimit"]
    assert counts == [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1]  # 4 <= 5; 12 > 10
    assert total == 16


def test_the_histogram_on_metrics() -> None:
    metrics = UpstreamMetrics()
    a, b = ServerStats(), ServerStats()
    a.record("ShouldRateLimit", 0.002)
    b.record("ShouldRateLimit", 0.03)
    b.record("Check", 0.0)
    sources = [_Source(a), _Source(b)]
    for source in sources:
        metrics.sources.add(source)
    registry = CollectorRegistry()
    registry.register(metrics)
    text = generate_latest(registry).decode()
    name = "ratelimit_service_response_time_seconds"
    assert f'{name}_bucket{{grpc_method="ShouldRateLimit",le="0.005"}} 1.0' in text
    assert f'{name}_bucket{{grpc_method="ShouldRateLimit",le="0.05"}} 2.0' in text
    assert f'{name}_bucket{{grpc_method="ShouldRateLimit",le="+Inf"}} 2.0' in text
    assert f'{name}_count{{grpc_method="ShouldRateLimit"}} 2.0' in text
    assert f'{name}_count{{grpc_method="Check"}} 1.0' in text
    assert 'ratelimit_service_total_requests_total{grpc_method="Check"} 1.0' in text
