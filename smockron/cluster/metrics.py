"""The counters of one cluster node, registered on a registry of its own.

Per instance, not module globals: several nodes in one process (tests, the functional
cluster) each count their own calls, and the names stay those an operator scrapes. The
node's ``/metrics`` serves this registry after prometheus-client's default one (the
process and Python runtime collectors). Discovery counts on the same registry when the
command line builds it (``registry=``); the Envoy front adds its collector with
``shared`` when it starts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.registry import Collector

C = TypeVar("C", bound=Collector)

DURATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.5)


class ClusterMetrics:
    """What one node counts; ``registry`` defaults to a fresh one."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._shared: dict[str, Any] = {}
        reg = self.registry
        self.checks = Counter(
            "smockron_cluster_checks_total", "Rate-limit checks answered, by how.", ["route"],
            registry=reg,
        )  # fmt: skip
        self.peer_failures = Counter(
            "smockron_cluster_peer_failures_total",
            "Items whose peer call failed (forwards answered here, GLOBAL hits lost).",
            registry=reg,
        )
        self.bad_globals = Counter(
            "smockron_cluster_peer_globals_rejected_total",
            "UpdatePeerGlobals entries skipped because their algorithm is unknown.",
            registry=reg,
        )
        self.grpc_malformed = Counter(
            "smockron_cluster_grpc_malformed_total",
            "gRPC calls whose request bytes did not decode, by method.",
            ["method"],
            registry=reg,
        )
        duration = Histogram(
            "smockron_cluster_request_duration_seconds",
            "Time to decide a GetRateLimits (client) or GetPeerRateLimits (peer) call.",
            ["kind"],
            buckets=DURATION_BUCKETS,
            registry=reg,
        )
        self.client_duration = duration.labels("client")
        self.peer_duration = duration.labels("peer")
        self.peer_calls_refused = Counter(
            "smockron_cluster_peer_calls_refused_total",
            "PeersV1 calls refused on the client gRPC port (they belong on the peer "
            "listener), by method.",
            ["method"],
            registry=reg,
        )
        self.unknown_method = Counter(
            "smockron_cluster_grpc_unknown_method_total",
            "gRPC calls to a method this node does not serve (native server).",
            registry=reg,
        )
        self.http_malformed = Counter(
            "smockron_cluster_http_malformed_total",
            "HTTP requests rejected as malformed (bad HTTP, bad JSON, bad fields).",
            ["reason"],
            registry=reg,
        )
        self.tls_client_san_refused = Counter(
            "smockron_cluster_tls_client_san_refused_total",
            "Client certificates refused for lacking GRPC_CLIENT_TLS_SAN: connections "
            "(native server) or calls (threads, asyncio).",
            registry=reg,
        )

    def shared(self, name: str, make: Callable[[], C]) -> C:
        """The collector ``name`` of this node, made and registered at first use: what a
        part may start more than once (the Envoy front) counts on one set of names."""
        collector = self._shared.get(name)
        if collector is None:
            collector = self._shared[name] = make()
            self.registry.register(collector)
        return cast(C, collector)
