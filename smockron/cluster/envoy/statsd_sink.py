"""envoyproxy/ratelimit's statsd stats (``USE_STATSD``), under upstream's names.

Upstream's stats library (lyft/gostats) keeps counters and gauges in memory and, every
``STATS_FLUSH_INTERVAL`` (10 s), writes to ``STATSD_HOST:STATSD_PORT`` over TCP the
counters that changed since the last flush (``name:delta|c``) and every gauge
(``name:value|g``); a timer's values are written as they come (``name:ms|ms``, one line a
call). This does the same with the ``statsd`` package's TCP client, off the event loop, so
a request never waits for statsd; the timers' lines go with each flush. Counters
(``<key>``: upstream's stats key, ``:``/``|`` and IPv4 dots made ``_``)::

    ratelimit.service.rate_limit.<key>.total_hits      (.over_limit, .near_limit,
        .within_limit, .shadow_mode, .over_limit_with_local_cache)
    ratelimit.service.rate_limit.<domain>.domain_not_found
    ratelimit.service.call.should_rate_limit.redis_error   (.service_error)
    ratelimit.service.config_load_success                  (config_load_error)
    ratelimit.service.global_shadow_mode
    ratelimit_server.<method>.total_requests      (gRPC calls: ShouldRateLimit, Check)

timers (milliseconds, truncated; written ``3.000000|ms`` by the client)::

    ratelimit_server.<method>.response_time

with ``BACKEND_TYPE=redis``, the pools' counters and gauge (:mod:`.redis_pool`)::

    ratelimit.redis_pool.cx_total     (cx_local_close; gauge cx_active)
    ratelimit.redis_per_second_pool.cx_total    (the same, with REDIS_PERSECOND)

and, with ``LOCAL_CACHE_SIZE_IN_BYTES`` (the Redis backend's local cache), gauges::

    ratelimit.localcache.evacuateCount   (expiredCount, entryCount, averageAccessTime,
        hitCount, missCount, lookupCount, overwriteCount)

``EXTRA_TAGS`` (``k1:v1,k2:v2``) are appended as gostats appends tags:
``<name>.__k1=v1.__k2=v2``, sorted by tag name, ``.``, ``:`` and ``|`` in values made ``_``.
A statsd that cannot be reached costs a rate-limited log line; the deltas are kept and
sent at the next flush that gets through.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any, Protocol

import statsd  # type: ignore[import-untyped]

from smockron.cluster.envoy.redis_pool import PoolStats, pool_counters, pool_gauges
from smockron.cluster.envoy.stats import StatsSource, grpc_calls, sanitize_stat_name
from smockron.ratelog import RateLimitedLog

log = logging.getLogger("smockron.cluster.envoy")


def tag_suffix(tags: Mapping[str, str]) -> str:
    """gostats' ``serializeTags`` suffix; pairs with an empty key or value are dropped."""
    out = []
    for key in sorted(k for k, v in tags.items() if k and v):
        value = tags[key].replace(".", "_").replace(":", "_").replace("|", "_")
        out.append(f".__{key}={value}")
    return "".join(out)


class CacheGauges(Protocol):
    def gauges(self) -> Mapping[str, int]: ...


def counters(source: StatsSource, tags: Mapping[str, str]) -> dict[str, int]:
    """Every counter of ``source`` under upstream's statsd name."""
    suffix = tag_suffix(tags)
    out: dict[str, int] = {}
    rl = "ratelimit.service.rate_limit."
    for key, stats in list(source.limit_stats.items()):
        clean = sanitize_stat_name(key)
        for name, value in stats.as_dict().items():
            out[f"{rl}{clean}.{name}{suffix}"] = value
    for domain, count in list(source.domain_not_found.items()):
        out[f"{rl}{sanitize_stat_name(domain)}.domain_not_found{suffix}"] = count
    s = source.stats
    service = "ratelimit.service."
    out[f"{service}call.should_rate_limit.redis_error{suffix}"] = s.limiter_errors
    out[f"{service}call.should_rate_limit.service_error{suffix}"] = s.invalid
    out[f"{service}config_load_success{suffix}"] = s.config_loads
    out[f"{service}config_load_error{suffix}"] = s.config_errors
    out[f"{service}global_shadow_mode{suffix}"] = s.global_shadow_mode
    for method, count in grpc_calls(source).items():
        out[f"ratelimit_server.{method}.total_requests{suffix}"] = count
    return out


def gauges(cache: CacheGauges | None, tags: Mapping[str, str]) -> dict[str, int]:
    """The local cache's gauges under upstream's statsd names (none without a cache)."""
    if cache is None:
        return {}
    suffix = tag_suffix(tags)
    return {f"ratelimit.localcache.{n}{suffix}": v for n, v in cache.gauges().items()}


class StatsdSink:
    def __init__(
        self,
        source: StatsSource,
        host: str,
        port: int,
        tags: Mapping[str, str] | None = None,
        interval: float = 10.0,
        local_cache: CacheGauges | None = None,
        pools: dict[str, PoolStats] | None = None,
    ) -> None:
        self.source = source
        self.local_cache = local_cache
        self.pools = pools or {}
        self.tags = dict(tags or {})
        self.interval = interval
        self.client = statsd.TCPStatsClient(host, port, timeout=5.0)
        self._sent: dict[str, int] = {}
        self._log = RateLimitedLog(log)

    def flush(self) -> int:
        """Send the counters that changed since the last flush that got through, the
        gauges and the times recorded since; the lines sent."""
        now = counters(self.source, self.tags)
        now.update(pool_counters(self.pools, tag_suffix(self.tags)))
        deltas = {n: v - self._sent.get(n, 0) for n, v in now.items()}
        deltas = {n: d for n, d in deltas.items() if d}
        server = self.source.server_stats
        times = server.take_times() if server is not None else {}
        pipe = self.client.pipeline()
        for name, delta in deltas.items():
            pipe.incr(name, delta)
        levels = gauges(self.local_cache, self.tags)
        levels.update(pool_gauges(self.pools, tag_suffix(self.tags)))
        for name, value in levels.items():
            pipe.gauge(name, value)
        lines = len(deltas) + len(levels) + self._add_times(pipe, times)
        if not lines:
            return 0
        try:
            pipe.send()
        except OSError as exc:
            self.client.close()
            if server is not None:
                server.put_back(times)
            self._log.warning(
                "envoy: statsd %s:%s: %s", self.client._host, self.client._port, exc, key="statsd"
            )
            return 0
        self._sent.update(now)
        return lines

    def _add_times(self, pipe: Any, times: dict[str, Counter[int]]) -> int:
        """One ``|ms`` line per call, as upstream's timer writes them."""
        suffix = tag_suffix(self.tags)
        lines = 0
        for method, counts in times.items():
            name = f"ratelimit_server.{method}.response_time{suffix}"
            for ms, n in sorted(counts.items()):
                for _ in range(n):
                    pipe.timing(name, ms)
                lines += n
        return lines

    async def run(self) -> None:
        """Flush every ``interval`` seconds until cancelled (then once more)."""
        try:
            while True:
                await asyncio.sleep(self.interval)
                await asyncio.to_thread(self.flush)
        finally:
            await asyncio.to_thread(self._final)

    def _final(self) -> None:
        self.flush()
        self.client.close()
