"""envoyproxy/ratelimit's statsd counters (``USE_STATSD``), under upstream's names.

Upstream's stats library (lyft/gostats) keeps counters in memory and, every
``STATS_FLUSH_INTERVAL`` (10 s), writes the counters that changed since the last flush to
``STATSD_HOST:STATSD_PORT`` over TCP, one ``name:delta|c`` line each. This does the same
with the ``statsd`` package's TCP client, off the event loop, so a request never waits for
statsd. Names (``<key>``: upstream's stats key, ``:``/``|`` and IPv4 dots made ``_``)::

    ratelimit.service.rate_limit.<key>.total_hits      (.over_limit, .near_limit,
        .within_limit, .shadow_mode, .over_limit_with_local_cache)
    ratelimit.service.rate_limit.<domain>.domain_not_found
    ratelimit.service.call.should_rate_limit.redis_error   (.service_error)
    ratelimit.service.config_load_success                  (config_load_error)
    ratelimit.service.global_shadow_mode
    ratelimit_server.ShouldRateLimit.total_requests

``EXTRA_TAGS`` (``k1:v1,k2:v2``) are appended as gostats appends tags:
``<name>.__k1=v1.__k2=v2``, sorted by tag name, ``.``, ``:`` and ``|`` in values made ``_``.
A statsd that cannot be reached costs a rate-limited log line; the deltas are kept and
sent at the next flush that gets through.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import statsd  # type: ignore[import-untyped]

from smockron.cluster.envoy.stats import StatsSource, sanitize_stat_name
from smockron.ratelog import RateLimitedLog

log = logging.getLogger("smockron.cluster.envoy")


def tag_suffix(tags: Mapping[str, str]) -> str:
    """gostats' ``serializeTags`` suffix; pairs with an empty key or value are dropped."""
    out = []
    for key in sorted(k for k, v in tags.items() if k and v):
        value = tags[key].replace(".", "_").replace(":", "_").replace("|", "_")
        out.append(f".__{key}={value}")
    return "".join(out)


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
    out[f"ratelimit_server.ShouldRateLimit.total_requests{suffix}"] = s.calls
    return out


class StatsdSink:
    def __init__(
        self,
        source: StatsSource,
        host: str,
        port: int,
        tags: Mapping[str, str] | None = None,
        interval: float = 10.0,
    ) -> None:
        self.source = source
        self.tags = dict(tags or {})
        self.interval = interval
        self.client = statsd.TCPStatsClient(host, port, timeout=5.0)
        self._sent: dict[str, int] = {}
        self._log = RateLimitedLog(log)

    def flush(self) -> int:
        """Send what changed since the last flush that got through; the lines sent."""
        now = counters(self.source, self.tags)
        deltas = {n: v - self._sent.get(n, 0) for n, v in now.items()}
        deltas = {n: d for n, d in deltas.items() if d}
        if not deltas:
            return 0
        pipe = self.client.pipeline()
        for name, delta in deltas.items():
            pipe.incr(name, delta)
        try:
            pipe.send()
        except OSError as exc:
            self.client.close()
            self._log.warning("envoy: statsd %s:%s: %s", self.client._host, self.client._port,
                              exc, key="statsd")  # fmt: skip
            return 0
        self._sent.update(now)
        return len(deltas)

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
