"""The Envoy front's counters, and envoyproxy/ratelimit's stats as Prometheus metrics.

Upstream emits statsd counters (``ratelimit.service.rate_limit.<stats key>.over_limit``
...) and, with ``USE_PROMETHEUS``, maps them to Prometheus names with its
``default_mapper.yaml``. In envoyproxy/ratelimit mode smockron sends the statsd counters too
(statsd_sink.py); in every mode the counters of a node's servicers
are exported on the node's registry (its ``/metrics``; ``UpstreamMetrics``, added by the
servicer) under upstream's mapped names, plus the ``_total`` suffix Prometheus clients give
counters:

==========================================================  ===============================
metric                                                      upstream statsd counter
==========================================================  ===============================
``ratelimit_service_rate_limit_total_hits_total``           ``rate_limit.<key>.total_hits``
``..._over_limit_total``, ``..._near_limit_total``,         ``.over_limit``, ``.near_limit``,
``..._within_limit_total``, ``..._shadow_mode_total``,      ``.within_limit``, ``.shadow_mode``,
``..._over_limit_with_local_cache_total``                   ``.over_limit_with_local_cache``
  (labels ``domain``, ``key1``, ``key2``: the stats key's first three dotted parts)
``ratelimit_service_rate_limit_domain_not_found_total``     ``rate_limit.<domain>.domain_not_found``
``ratelimit_service_should_rate_limit_error_total``         ``call.should_rate_limit.redis_error``
  (label ``err_type``: ``redis_error``, ``service_error``)  and ``.service_error``
``ratelimit_service_config_load_success_total``, ``_error``  ``config_load_success``, ``_error``
``ratelimit_service_global_shadow_mode_total``              ``global_shadow_mode``
``ratelimit_service_total_requests_total``                  ``ratelimit_server.<method>.``
                                                            ``total_requests``
``ratelimit_service_response_time_seconds`` (a histogram,   ``ratelimit_server.<method>.``
  label ``grpc_method``; envoyproxy/ratelimit mode only)    ``response_time`` (a timer)
==========================================================  ===============================
"""

from __future__ import annotations

import bisect
import math
import re
import struct
import threading
import weakref
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from smockron.counters import CounterSet


@dataclass(slots=True)
class EnvoyStats(CounterSet):
    """Counters of the Envoy front (exported by whoever runs it)."""

    calls: int = 0
    descriptors: int = 0
    over_limit: int = 0
    shadow_over_limit: int = 0
    invalid: int = 0
    limiter_errors: int = 0
    config_errors: int = 0
    config_loads: int = 0
    global_shadow_mode: int = 0
    json_malformed: int = 0
    """``POST /json`` bodies that are not a RateLimitRequest (envoyproxy/ratelimit mode)."""


@dataclass(slots=True)
class LimitStats(CounterSet):
    """Upstream's per-limit counters, for one stats key."""

    total_hits: int = 0
    over_limit: int = 0
    near_limit: int = 0
    within_limit: int = 0
    shadow_mode: int = 0
    over_limit_with_local_cache: int = 0


def near_threshold(limit: int, ratio: float) -> int:
    """``floor(limit * ratio)`` computed in float32, as upstream computes it."""
    product = _f32(_f32(float(limit)) * _f32(ratio))
    return math.floor(product)


def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def record(
    stats: LimitStats, limit: int, before: int, hits: int, over: bool, shadow: bool, near: int
) -> None:
    """Count one descriptor's ``hits`` as upstream's base limiter does: ``before`` is the
    window's count before them, ``near`` the near-limit threshold."""
    after = before + hits
    stats.total_hits += hits
    if over:
        if before >= limit:
            stats.over_limit += hits
        else:
            stats.over_limit += after - limit
            stats.near_limit += limit - max(near, before)
        if shadow:
            stats.shadow_mode += hits if before >= limit else after - limit
        return
    if after > near:
        stats.near_limit += hits if before >= near else after - near
    stats.within_limit += hits


RESPONSE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""The buckets of ``ratelimit_service_response_time_seconds``: statsd_exporter's default
(Prometheus' DefBuckets), which upstream's mapper leaves them at."""


class ServerStats:
    """envoyproxy/ratelimit's ``ratelimit_server.<method>`` stats, which its gRPC server's
    interceptor keeps for every unary call (``ShouldRateLimit``, the health ``Check``; not
    ``POST /json``): the calls, and each call's time in whole milliseconds (truncated, as
    upstream's ``time.Since(start).Milliseconds()``). The times are kept as a count per
    value until sent to statsd, so a statsd that cannot be reached costs no memory per
    call, and in the histogram upstream's Prometheus mapper makes of them: seconds, or
    milliseconds with ``PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`` (upstream then drops the
    mapper's scale, the buckets stay)."""

    def __init__(self, milliseconds: bool = False) -> None:
        self.total_requests: dict[str, int] = {}
        self.histograms: dict[str, tuple[list[int], float]] = {}
        """Per method: the calls in each of RESPONSE_BUCKETS (and above), and the sum."""
        self._scale = 1.0 if milliseconds else 0.001
        self._times: dict[str, Counter[int]] = {}
        self._lock = threading.Lock()  # calls are recorded on gRPC threads too

    def record(self, method: str, seconds: float) -> None:
        ms = int(seconds * 1000)
        value = ms * self._scale
        with self._lock:
            self.total_requests[method] = self.total_requests.get(method, 0) + 1
            times = self._times.get(method)
            if times is None:
                times = self._times[method] = Counter()
            times[ms] += 1
            counts, total = self.histograms.get(method) or ([0] * (len(RESPONSE_BUCKETS) + 1), 0.0)
            counts[bisect.bisect_left(RESPONSE_BUCKETS, value)] += 1
            self.histograms[method] = (counts, total + value)

    def take_times(self) -> dict[str, Counter[int]]:
        """The times recorded since the last take, per method (and forgets them)."""
        with self._lock:
            taken, self._times = self._times, {}
        return taken

    def put_back(self, taken: dict[str, Counter[int]]) -> None:
        """Times taken but not sent: they go with the next take."""
        with self._lock:
            for method, counts in taken.items():
                self._times.setdefault(method, Counter()).update(counts)


class StatsSource(Protocol):
    stats: EnvoyStats
    limit_stats: dict[str, LimitStats]
    domain_not_found: dict[str, int]
    server_stats: ServerStats | None


def grpc_calls(source: StatsSource) -> dict[str, int]:
    """Upstream's ``total_requests`` per gRPC method: the gRPC calls when they are counted
    apart (envoyproxy/ratelimit mode), else every ShouldRateLimit call."""
    server = source.server_stats
    if server is None:
        return {"ShouldRateLimit": source.stats.calls}
    return dict(server.total_requests)


class EnvoyStatsCollector(Collector):
    """Exports an EnvoyStats as Prometheus counters ``smockron_envoy_<field>_total``.

    Register it on the registry behind ``/metrics``:
    ``node.metrics.registry.register(EnvoyStatsCollector(servicer.stats))``.
    """

    def __init__(self, stats: EnvoyStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        for name, value in self.stats.as_dict().items():
            yield CounterMetricFamily(
                f"smockron_envoy_{name}",
                f"Envoy rate limit service: {name.replace('_', ' ')}",
                value=value,
            )


_IPV4 = re.compile(r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}")
_LIMIT_FIELDS = tuple(LimitStats().as_dict())


def sanitize_stat_name(name: str) -> str:
    """Upstream's ``SanitizeStatName``: ``:`` and ``|`` become ``_``, and so do the dots
    of IPv4 addresses."""
    name = name.replace(":", "_").replace("|", "_")
    return _IPV4.sub(lambda m: m.group(0).replace(".", "_"), name)


def stat_labels(stats_key: str) -> tuple[str, str, str]:
    """``(domain, key1, key2)`` as upstream's Prometheus mapper labels a stats key."""
    parts = sanitize_stat_name(stats_key).split(".")
    parts += ["", ""]
    return parts[0], parts[1], parts[2]


class UpstreamMetrics(Collector):
    """The counters of every live servicer in ``sources`` (those of one node) under
    envoyproxy/ratelimit's Prometheus names."""

    NAME = "envoy_upstream"
    """Its name among a node's shared collectors (``ClusterMetrics.shared``)."""

    def __init__(self) -> None:
        self.sources: weakref.WeakSet[StatsSource] = weakref.WeakSet()

    def collect(self) -> Iterator[Metric]:
        sources = list(self.sources)
        yield from self._limits(sources)
        yield self._family(
            "ratelimit_service_rate_limit_domain_not_found",
            "Descriptors of a domain that is not configured.",
            ["domain"],
            _sum((((d,), n) for s in sources for d, n in s.domain_not_found.items())),
        )
        errors: dict[tuple[str, ...], int] = {("redis_error",): 0, ("service_error",): 0}
        for s in sources:
            errors["redis_error",] += s.stats.limiter_errors
            errors["service_error",] += s.stats.invalid
        yield self._family(
            "ratelimit_service_should_rate_limit_error",
            "ShouldRateLimit calls that failed: limiter (redis_error) or request (service_error).",
            ["err_type"],
            errors,
        )
        for name, field, doc in (
            ("config_load_success", "config_loads", "Configurations loaded."),
            ("config_load_error", "config_errors", "Configurations that did not load."),
            ("global_shadow_mode", "global_shadow_mode", "OVER_LIMIT made OK by SHADOW_MODE."),
        ):
            total = sum(getattr(s.stats, field) for s in sources)
            yield self._family(f"ratelimit_service_{name}", doc, [], {(): total})
        calls: dict[tuple[str, ...], int] = {("ShouldRateLimit",): 0}
        for s in sources:
            for method, n in grpc_calls(s).items():
                calls[method,] = calls.get((method,), 0) + n
        yield self._family(
            "ratelimit_service_total_requests", "Calls, by gRPC method.", ["grpc_method"], calls
        )
        yield _response_times(sources)

    def _limits(self, sources: list[StatsSource]) -> Iterator[Metric]:
        totals: dict[str, dict[tuple[str, ...], int]] = {f: {} for f in _LIMIT_FIELDS}
        for source in sources:
            for key, stats in list(source.limit_stats.items()):
                labels = stat_labels(key)
                for name, value in stats.as_dict().items():
                    totals[name][labels] = totals[name].get(labels, 0) + value
        for name in _LIMIT_FIELDS:
            yield self._family(
                f"ratelimit_service_rate_limit_{name}",
                f"Hits counted as {name.replace('_', ' ')}, by upstream's stats key.",
                ["domain", "key1", "key2"],
                totals[name],
            )

    @staticmethod
    def _family(
        name: str, doc: str, labels: list[str], values: dict[tuple[str, ...], int]
    ) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=labels)
        for label_values, value in values.items():
            family.add_metric(list(label_values), value)
        return family


def _response_times(sources: list[StatsSource]) -> HistogramMetricFamily:
    """``ratelimit_service_response_time_seconds{grpc_method}`` over the sources that time
    their gRPC calls (envoyproxy/ratelimit mode)."""
    merged: dict[str, tuple[list[int], float]] = {}
    for source in sources:
        server = source.server_stats
        for method, (counts, total) in list(server.histograms.items()) if server else ():
            into, into_total = merged.get(method) or ([0] * len(counts), 0.0)
            merged[method] = (
                [a + b for a, b in zip(into, counts, strict=True)],
                into_total + total,
            )
    family = HistogramMetricFamily(
        "ratelimit_service_response_time_seconds",
        "Time of each gRPC call, by method (whole milliseconds, as upstream times them).",
        labels=["grpc_method"],
    )
    for method, (counts, total) in sorted(merged.items()):
        cumulative, buckets = 0, []
        for bound, n in zip((*map(str, RESPONSE_BUCKETS), "+Inf"), counts, strict=True):
            cumulative += n
            buckets.append((bound, float(cumulative)))
        family.add_metric([method], buckets, total)
    return family


def _sum(items: Iterator[tuple[tuple[str, ...], int]]) -> dict[tuple[str, ...], int]:
    out: dict[tuple[str, ...], int] = {}
    for labels, value in items:
        out[labels] = out.get(labels, 0) + value
    return out
