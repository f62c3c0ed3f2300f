"""The counters of one cluster node, registered on a registry of its own.

Per instance, not module globals: several nodes in one process (tests, the functional
cluster) each count their own calls, and the names stay those an operator scrapes. The
node's ``/metrics`` serves this registry after prometheus-client's default one (the
process and Python runtime collectors). Discovery counts on the same registry when the
command line builds it (``registry=``); the Envoy front adds its collector with
``shared`` when it starts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.registry import Collector

C = TypeVar("C", bound=Collector)

DURATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.5)
SYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ClusterMetrics:
    """What one node counts; ``registry`` defaults to a fresh one."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._shared: dict[str, Any] = {}
        reg = self.registry
        self.checks = Counter(
            "smockron_cluster_checks_total",
            "Rate-limit checks answered, by how.",
            ["route"],
            registry=reg,
        )
        self.peer_failures = Counter(
            "smockron_cluster_peer_failures_total",
            "Items whose peer call failed (forwards answered here, GLOBAL hits lost).",
            registry=reg,
        )
        self.peer_globals = Counter(
            "smockron_cluster_peer_globals_total",
            "UpdatePeerGlobals entries received (GLOBAL state from owners).",
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
        self.request_duration = duration
        self.client_duration = duration.labels("client")
        self.peer_duration = duration.labels("peer")
        self.global_sync_duration = Histogram(
            "smockron_cluster_global_sync_seconds",
            "Time of one GLOBAL round that sent something: hits to their owners, or the "
            "owner's broadcast of its state to the other nodes.",
            ["kind"],
            buckets=SYNC_BUCKETS,
            registry=reg,
        )
        self.global_sync_errors = Counter(
            "smockron_cluster_global_sync_errors_total",
            "Failed GLOBAL calls: hits to an owner, or a broadcast to one node.",
            ["kind"],
            registry=reg,
        )
        self.peer_calls_refused = Counter(
            "smockron_cluster_peer_calls_refused_total",
            "PeersV1 calls refused on the client gRPC port (they belong on the peer "
            "listener), by method.",
            ["method"],
            registry=reg,
        )
        self.peer_calls_not_member = Counter(
            "smockron_cluster_peer_calls_not_member_total",
            "PeersV1 calls refused on the peer listener: the caller's address is not a "
            "member's in the peer list, by method.",
            ["method"],
            registry=reg,
        )
        self.peer_tls_names_refused = Counter(
            "smockron_cluster_peer_tls_names_refused_total",
            "Peer certificates refused on the peer listener for carrying none of "
            "peer_tls_names: connections (native server) or calls (threads, asyncio).",
            registry=reg,
        )
        self.http_connections_closed = Counter(
            "smockron_cluster_http_connections_closed_total",
            "HTTP connections the gateway closed to stay available: header_timeouts (no "
            "complete request headers in time), connections_evicted (the longest idle, at "
            "the connection cap), connections_refused (at the cap, every one busy).",
            ["reason"],
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
        self.check_errors = Counter(
            "smockron_cluster_check_errors_total",
            "Check calls or items refused before any limiter ran, by Gubernator's error "
            'label: "Request too large" (a call of more than 1,000 items), "Invalid '
            'algorithm" (an item naming no known algorithm).',
            ["error"],
            registry=reg,
        )
        self.in_flight = 0
        """GetRateLimits calls being answered on the event loop (a plain integer: read
        when scraped, as Gubernator's concurrent_checks gauge)."""

    def shared(self, name: str, make: Callable[[], C]) -> C:
        """The collector ``name`` of this node, made and registered at first use: what a
        part may start more than once (the Envoy front) counts on one set of names."""
        collector = self._shared.get(name)
        if collector is None:
            collector = self._shared[name] = make()
            self.registry.register(collector)
        return cast(C, collector)


# -- Gubernator's names ----------------------------------------------------------------------

_V1 = "/pb.gubernator.V1/GetRateLimits"
_PEERS = "/pb.gubernator.PeersV1/GetPeerRateLimits"
_METHODS = {"client": _V1, "peer": _PEERS}
_HELP = {
    "gubernator_getratelimit_counter": 'The count of getLocalRateLimit() calls.  Label "calltype" '
    'may be "local" for calls handled by the same peer, or "global" for global rate limits.',
    "gubernator_grpc_request_counts": "The count of gRPC requests.",
    "gubernator_grpc_request_duration": "The timings of gRPC requests in seconds",
    "gubernator_global_send_duration": "The duration of GLOBAL async sends in seconds.",
    "gubernator_global_send_errors": "The count of errors during global send to owning peer",
    "gubernator_broadcast_duration": "The duration of GLOBAL broadcasts to peers in seconds.",
    "gubernator_broadcast_errors": "The count of errors during during UpdatePeerGlobals",
    "gubernator_cache_size": "The number of items in LRU Cache which holds the rate limits.",
    "gubernator_updatepeerglobals_counter": "The count of items received in UpdatePeerGlobals",
    "gubernator_over_limit_counter": "The number of rate limit checks that are over the limit.",
    "gubernator_check_error_counter": "The number of errors while checking rate limits.",
    "gubernator_cache_access_count": 'Cache access counts.  Label "type" = hit|miss.',
    "gubernator_unexpired_evictions_count": "Count the number of cache items which were "
    "evicted while unexpired.",
    "gubernator_func_duration": "The timings of key functions in Gubernator in seconds.",
    "gubernator_concurrent_checks_counter": "The number of concurrent GetRateLimits API calls.",
    "gubernator_global_send_queue_length": "The count of requests queued up for global "
    "broadcast.  This is only used for GetRateLimit requests using global behavior.",
    "gubernator_global_queue_length": "The count of requests queued up for global broadcast.  "
    "This is only used for GetRateLimit requests using global behavior.",
    "gubernator_batch_queue_length": "The getRateLimitsBatch() queue length in PeerClient.  "
    "This represents rate checks queued by for batching to a remote peer.",
}
_FUNCS = {"client": "V1Instance.GetRateLimits", "peer": "V1Instance.GetPeerRateLimits"}
"""gubernator_func_duration's ``name`` for the calls smockron times: its other names time
Go functions (worker pool, peer client batching) smockron has no counterpart of."""

Samples = list[tuple[str, dict[str, str], float]]


def gubernator_exposition(
    metrics: ClusterMetrics,
    cache_size: int,
    stats: Mapping[str, int] | None = None,
    *,
    global_queues: tuple[int, int] = (0, 0),
    batch_queues: Mapping[str, int] | None = None,
) -> bytes:
    """Gubernator's own metric families (names, types and labels as its Go source
    declares them), in the Prometheus text format, computed from this node's counters
    when scraped: nothing is counted twice per request.

    Written here rather than by prometheus-client, which would rename a counter
    ``..._total``; Gubernator's Go client does not. A summary's quantiles (0.5 and 0.99,
    Gubernator's objectives) are estimated from the histogram's buckets since start,
    where Gubernator's come from a sliding ten-minute window.

    ``stats`` are the limiter's counters (``LocalLimiter.stats``): over the limit, cache
    hits and misses, unexpired evictions, invalid items; a limiter without them counts 0.
    ``global_queues`` are GLOBAL keys waiting for a round (hits to send, broadcasts),
    ``batch_queues`` the forwarded items waiting for a batch, by peer address."""
    stats = stats or {}
    lines: list[str] = []
    checks = _values(metrics.checks, "route")
    local = sum(v for route, v in checks.items() if route not in ("forwarded", "global_replica"))
    glob = checks.get("global_replica", 0.0)
    _family(
        lines,
        "gubernator_getratelimit_counter",
        "counter",
        [
            ("", {"calltype": "local"}, local),
            ("", {"calltype": "global"}, glob),
        ],
    )
    requests = _histograms(metrics.request_duration, "kind")
    malformed = _values(metrics.grpc_malformed, "method")
    counts: Samples = []
    durations: Samples = []
    for kind, method in _METHODS.items():
        hist = requests.get(kind, _EMPTY)
        failed = sum(v for m, v in malformed.items() if method.endswith("/" + m))
        counts += [
            ("", {"method": method, "status": "failed"}, failed),
            ("", {"method": method, "status": "success"}, hist.count),
        ]
        durations += hist.summary({"method": method})
    _family(lines, "gubernator_grpc_request_counts", "counter", counts)
    _family(lines, "gubernator_grpc_request_duration", "summary", durations)
    sync = _histograms(metrics.global_sync_duration, "kind")
    errors = _values(metrics.global_sync_errors, "kind")
    _family(
        lines, "gubernator_global_send_duration", "summary", sync.get("hits", _EMPTY).summary({})
    )
    _family(lines, "gubernator_global_send_errors", "counter", [("", {}, errors.get("hits", 0))])
    _family(
        lines, "gubernator_broadcast_duration", "summary", sync.get("broadcast", _EMPTY).summary({})
    )
    _family(lines, "gubernator_broadcast_errors", "counter", [("", {}, errors.get("broadcast", 0))])
    _family(lines, "gubernator_cache_size", "gauge", [("", {}, float(cache_size))])
    received = sum(
        s.value
        for m in metrics.peer_globals.collect()
        for s in m.samples
        if s.name.endswith("_total")
    )
    _family(lines, "gubernator_updatepeerglobals_counter", "counter", [("", {}, received)])
    _family(
        lines, "gubernator_over_limit_counter", "counter", [("", {}, stats.get("over_limit", 0))]
    )
    errors = {
        "Invalid request": float(stats.get("invalid", 0)),
        "Request too large": 0.0,
        "Invalid algorithm": 0.0,
    }
    for label, value in _values(metrics.check_errors, "error").items():
        errors[label] = errors.get(label, 0.0) + value
    _family(
        lines,
        "gubernator_check_error_counter",
        "counter",
        [("", {"error": label}, value) for label, value in sorted(errors.items())],
    )
    _family(
        lines,
        "gubernator_cache_access_count",
        "counter",
        [
            ("", {"type": "hit"}, stats.get("hit", 0)),
            ("", {"type": "miss"}, stats.get("miss", 0)),
        ],
    )
    _family(
        lines,
        "gubernator_unexpired_evictions_count",
        "counter",
        [("", {}, stats.get("unexpired_evictions", 0))],
    )
    funcs: Samples = []
    for kind, name in _FUNCS.items():
        funcs += requests.get(kind, _EMPTY).summary({"name": name}, (0.5, 0.99, 1.0))
    _family(lines, "gubernator_func_duration", "summary", funcs)
    _family(
        lines, "gubernator_concurrent_checks_counter", "gauge", [("", {}, float(metrics.in_flight))]
    )
    _family(
        lines, "gubernator_global_send_queue_length", "gauge", [("", {}, float(global_queues[0]))]
    )
    _family(lines, "gubernator_global_queue_length", "gauge", [("", {}, float(global_queues[1]))])
    batches = sorted((batch_queues or {}).items())
    _family(
        lines,
        "gubernator_batch_queue_length",
        "gauge",
        [("", {"peerAddr": peer}, float(n)) for peer, n in batches],
    )
    return "".join(lines).encode()


def _family(lines: list[str], name: str, kind: str, samples: Samples) -> None:
    lines.append(f"# HELP {name} {_HELP[name]}\n# TYPE {name} {kind}\n")
    for suffix, labels, value in samples:
        text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        number = _number(value)
        lines.append(
            f"{name}{suffix}{{{text}}} {number}\n" if text else f"{name}{suffix} {number}\n"
        )


def _number(value: float) -> str:
    """As Go writes it: ``3``, ``0.25``, ``NaN``."""
    if math.isnan(value):
        return "NaN"
    value = float(value)
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def _values(collector: Counter, label: str) -> dict[str, float]:
    """A labelled counter's totals by ``label``."""
    return {
        s.labels[label]: s.value
        for m in collector.collect()
        for s in m.samples
        if s.name.endswith("_total")
    }


class _Histogram:
    """One labelled child of a histogram, as scraped: cumulative buckets, count, sum."""

    def __init__(self) -> None:
        self.buckets: list[tuple[float, float]] = []
        self.count = 0.0
        self.sum = 0.0

    def quantile(self, q: float) -> float:
        """Linear interpolation inside the bucket holding rank q (PromQL's
        histogram_quantile); NaN when nothing was observed, as a Go summary says."""
        if not self.count:
            return float("nan")
        rank, low, below = q * self.count, 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                if bound == float("inf"):
                    return low
                inside = cumulative - below
                return low + (bound - low) * ((rank - below) / inside if inside else 0.0)
            low, below = bound, cumulative
        return low

    def summary(
        self, labels: dict[str, str], quantiles: tuple[float, ...] = (0.5, 0.99)
    ) -> Samples:
        out: Samples = [
            ("", {**labels, "quantile": _number(q)}, self.quantile(q)) for q in quantiles
        ]
        return [*out, ("_sum", labels, self.sum), ("_count", labels, self.count)]


_EMPTY = _Histogram()


def _histograms(collector: Histogram, label: str) -> dict[str, _Histogram]:
    out: dict[str, _Histogram] = {}
    for metric in collector.collect():
        for s in metric.samples:
            child = out.setdefault(s.labels[label], _Histogram())
            if s.name.endswith("_bucket"):
                child.buckets.append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_count"):
                child.count = s.value
            elif s.name.endswith("_sum"):
                child.sum = s.value
    return out
