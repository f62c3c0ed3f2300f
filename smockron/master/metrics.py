"""Prometheus metrics, read from the master's counters at scrape time (no hot-path cost)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from smockron.errors import ConfigError
from smockron.master.stats import Stats

_PER_DOMAIN = {
    "published": ("smockron_master_delay_until_published", "DELAY_UNTIL messages published"),
    "malformed": ("smockron_master_malformed_domain", "Malformed messages naming this domain"),
    "dropped": ("smockron_master_dropped", "Messages dropped by the full queue"),
    "skewed": ("smockron_master_skewed", "Messages re-timed to the master's clock"),
    "late": ("smockron_master_late", "Backlog of a reconnecting gatekeeper, too old to charge"),
}


class StatsCollector(Collector):
    """Exposes a :class:`Stats` as counters labelled by domain (and status or reason)."""

    def __init__(self, stats: Stats, queue_depth: Any = None) -> None:
        self.stats = stats
        self.queue_depth = queue_depth

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
        if self.queue_depth is not None:
            yield GaugeMetricFamily(
                "smockron_master_queue_depth",
                "Messages received and waiting to be processed",
                value=self.queue_depth(),
            )


def parse_listen(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``:PORT`` for all interfaces)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"cannot parse metrics address {address!r}: expected HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def serve_metrics(address: str, stats: Stats, queue_depth: Any = None) -> Any:
    """Start the HTTP endpoint in a daemon thread; returns the server (``.shutdown()``)."""
    host, port = parse_listen(address)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector(stats, queue_depth))
    try:
        server, _thread = start_http_server(port, host, registry=registry)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {address}: {exc.strerror or exc}") from None
    return server
