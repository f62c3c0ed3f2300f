"""Prometheus metrics, read from the master's counters at scrape time (no hot-path cost)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from smockron.master.stats import Stats
from smockron.observe import ObserveServer, Readiness, parse_listen, serve
from smockron.observe.throttled import TopThrottled

__all__ = ["StatsCollector", "parse_listen", "serve_metrics", "stats_json"]

_PER_DOMAIN = {
    "published": ("smockron_master_delay_until_published", "DELAY_UNTIL messages published"),
    "malformed": ("smockron_master_malformed_domain", "Malformed messages naming this domain"),
    "dropped": ("smockron_master_dropped", "Messages dropped by the full queue"),
    "skewed": ("smockron_master_skewed", "Messages re-timed to the master's clock"),
    "late": ("smockron_master_late", "Backlog of a reconnecting gatekeeper, too old to charge"),
}


class StatsCollector(Collector):
    """Exposes a :class:`Stats` as counters labelled by domain (and status or reason)."""

    def __init__(self, stats: Stats, queue_depth: Any = None, store: Any = None) -> None:
        self.stats = stats
        self.queue_depth = queue_depth
        self.store = store

    def collect(self) -> Iterator[Any]:
        domains = list(self.stats.domains.items())
        messages = CounterMetricFamily(
            "smockron_master_messages",
            "Accounting messages by domain and status",
            labels=["domain", "status"],
        )
        for name, s in domains:
            for status in ("accepted", "delayed", "rejected"):
                messages.add_metric([name, status], getattr(s, status))
        yield messages
        for attr, (metric, doc) in _PER_DOMAIN.items():
            family = CounterMetricFamily(metric, doc, labels=["domain"])
            for name, s in domains:
                family.add_metric([name], getattr(s, attr))
            yield family
        malformed = CounterMetricFamily(
            "smockron_master_malformed", "Malformed messages by reason", labels=["reason"]
        )
        for reason, count in sorted(self.stats.malformed.items()):
            malformed.add_metric([reason], count)
        yield malformed
        yield CounterMetricFamily(
            "smockron_master_unknown_domain",
            "Messages for a domain without rules (ignored)",
            value=self.stats.unknown_domain,
        )
        yield CounterMetricFamily(
            "smockron_master_dropped_all",
            "Messages dropped by the full queue, whatever their domain",
            value=self.stats.dropped,
        )
        yield CounterMetricFamily(
            "smockron_master_auth_denied",
            "CURVE handshakes refused: the key is not an allowed gatekeeper's",
            value=self.stats.auth_denied,
        )
        yield CounterMetricFamily(
            "smockron_master_fleet_peer_returns",
            "Fleet peers heard again after a silence; each is asked for the shards' states",
            value=self.stats.peer_returns,
        )
        if self.queue_depth is not None:
            yield GaugeMetricFamily(
                "smockron_master_queue_depth",
                "Messages received and waiting to be processed",
                value=self.queue_depth(),
            )
        yield from store_metrics(self.store)


def store_metrics(store: Any) -> Iterator[Any]:
    """The store's breaker (Redis) or snapshot (memory with a path), when it has one."""
    breaker = getattr(store, "breaker", None)
    if breaker is not None:
        yield GaugeMetricFamily(
            "smockron_master_store_breaker_state",
            "The store's circuit breaker: 0 closed, 1 open (deciding from memory), 2 half-open",
            value=int(breaker.state),
        )
        transitions = CounterMetricFamily(
            "smockron_master_store_breaker_transitions",
            "Breaker transitions by the state entered",
            labels=["to"],
        )
        for state in ("open", "half_open", "closed"):
            transitions.add_metric([state], breaker.transitions[state])
        yield transitions
        yield CounterMetricFamily(
            "smockron_master_store_errors",
            "Store calls that failed or timed out",
            value=breaker.failures,
        )
    if getattr(store, "snapshot", None) is not None:
        yield CounterMetricFamily(
            "smockron_master_store_snapshot_writes",
            "Snapshots of the memory store written",
            value=store.snapshot_writes,
        )
        yield CounterMetricFamily(
            "smockron_master_store_snapshot_failures",
            "Snapshots that could not be written",
            value=store.snapshot_failures,
        )
        yield GaugeMetricFamily(
            "smockron_master_store_snapshot_states",
            "States in the last snapshot written or read",
            value=store.snapshot_states,
        )


def stats_json(
    stats: Stats, throttled: TopThrottled | None = None, queue_depth: Any = None
) -> dict[str, Any]:
    """The ``/stats`` body ``smockron top`` reads: per-domain counters, the top throttled
    identifiers (escaped) and the time, so rates come from two readings."""
    return {
        "time": time.time(),
        "domains": {name: s.as_dict() for name, s in sorted(stats.domains.items())},
        "unknown_domain": stats.unknown_domain,
        "dropped": stats.dropped,
        "malformed": sum(stats.malformed.values()),
        "queue_depth": queue_depth() if queue_depth is not None else 0,
        "top": throttled.top() if throttled is not None else {},
        "top_window_s": throttled.window_s if throttled is not None else 0,
    }


def serve_metrics(
    address: str,
    stats: Stats,
    queue_depth: Any = None,
    *,
    readiness: Readiness | None = None,
    throttled: TopThrottled | None = None,
    store: Any = None,
) -> ObserveServer:
    """Start the listener (/metrics, /healthz, /readyz, /stats) in a daemon thread;
    returns it (``.close()``). Call from the master's loop, which /healthz watches."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector(stats, queue_depth, store))
    return serve(
        address,
        readiness or Readiness(),
        registry,
        stats=lambda: stats_json(stats, throttled, queue_depth),
    )
