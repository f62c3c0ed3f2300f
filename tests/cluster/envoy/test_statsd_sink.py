"""The statsd sink against a real TCP statsd listener on 127.0.0.1: a statsd that cannot
be reached loses nothing (counter deltas, timer values), gauges go with every flush."""

from __future__ import annotations

import time

from smockron.cluster.envoy.redis_cache import OverLimitCache
from smockron.cluster.envoy.stats import EnvoyStats, LimitStats, ServerStats
from smockron.cluster.envoy.statsd_sink import StatsdSink
from tests.cluster.envoy.conftest import StatsdListener
from tests.support import free_port, wait_for


class _Source:
    """What the sink reads of a servicer."""

    def __init__(self) -> None:
        self.stats = EnvoyStats(calls=0, config_loads=1)
        self.limit_stats: dict[str, LimitStats] = {"edge.path_/api": LimitStats(total_hits=2)}
        self.domain_not_found: dict[str, int] = {}
        self.server_stats: ServerStats | None = ServerStats()


def test_nothing_is_lost_while_statsd_is_away() -> None:
    source = _Source()
    assert source.server_stats is not None
    source.server_stats.record("ShouldRateLimit", 0.003)
    source.server_stats.record("ShouldRateLimit", 0.0001)
    cache = OverLimitCache(0)
    assert "k" not in cache
    port = free_port()
    sink = StatsdSink(source, "127.0.0.1", port, {"a": "b"}, local_cache=cache)
    assert sink.flush() == 0  # nobody listens: nothing counted as sent
    source.server_stats.record("ShouldRateLimit", 0.002)
    source.limit_stats["edge.path_/api"].total_hits += 1
    listener = StatsdListener(port=port)
    listener.start()
    try:
        sent = sink.flush()
        timer = "ratelimit_server.ShouldRateLimit.response_time.__a=b"
        hits = "ratelimit.service.rate_limit.edge.path_/api.total_hits.__a=b"
        wait_for(lambda: len(listener.times(timer)) == 3 and listener.get(hits) == 3)
        assert sorted(listener.times(timer)) == [0.0, 2.0, 3.0]
        assert listener.get("ratelimit_server.ShouldRateLimit.total_requests.__a=b") == 3
        assert listener.gauges_under("ratelimit.localcache.")["missCount.__a=b"] == 1
        assert sent == len(listener.lines)
        before = len(listener.lines)
        assert sink.flush() == 8  # unchanged counters are not sent again; every gauge is
        wait_for(lambda: len(listener.lines) == before + 8)
        time.sleep(0.1)
        assert listener.get(hits) == 3 and len(listener.times(timer)) == 3
    finally:
        sink.client.close()
        listener.stop()
