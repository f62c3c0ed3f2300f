"""Configuration of a cluster node: defaults, Gubernator's GUBER_* variables, Go durations.

Flags win over environment variables, which win over the defaults here; the defaults are
Gubernator's (batch wait 500 us, batch limit 1,000, global sync wait 100 ms...).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from smockron.core.hashring import DEFAULT_REPLICAS, HASHES
from smockron.errors import ConfigError

_GO_UNITS_MS = {
    "ns": 1e-6,
    "us": 1e-3,
    "µs": 1e-3,
    "μs": 1e-3,
    "ms": 1.0,
    "s": 1000.0,
    "m": 60_000.0,
    "h": 3_600_000.0,
}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration_ms(text: str) -> float:
    """A Go duration (``500us``, ``1m30s``) or a bare number of milliseconds, in ms."""
    value = text.strip()
    if not value:
        raise ConfigError("empty duration")
    try:
        return float(value)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for match in _GO_PART.finditer(value):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _GO_UNITS_MS[match.group(2)]
        pos = match.end()
    if pos != len(value) or pos == 0:
        raise ConfigError(f"invalid duration {text!r}: use e.g. 500us, 100ms, 1s")
    return total


GRPC_SERVERS = ("threads", "asyncio", "native")


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    grpc_address: str = "127.0.0.1:1051"
    http_address: str = "127.0.0.1:1050"
    advertise_address: str = ""
    """The gRPC address peers use for this node; defaults to ``grpc_address``."""
    peer_discovery: str = "static"
    peers: tuple[str, ...] = ()
    etcd_endpoints: tuple[str, ...] = ("127.0.0.1:2379",)
    etcd_key_prefix: str = "/gubernator-peers"
    dns_fqdn: str = ""
    k8s_namespace: str = "default"
    k8s_selector: str = ""
    k8s_pod_ip: str = ""
    k8s_pod_port: str = ""
    data_center: str = ""
    batch_wait_ms: float = 0.5
    batch_limit: int = 1000
    batch_timeout_ms: float = 500.0
    global_sync_wait_ms: float = 100.0
    global_batch_limit: int = 1000
    global_timeout_ms: float = 500.0
    cache_size: int = 50_000
    peer_down_after: int = 3
    """Consecutive failed calls after which a peer leaves the ring until it answers again."""
    peer_probe_interval_ms: float = 1000.0
    envoy_config: str = ""
    envoy_reload_interval_ms: float = 5000.0
    envoy_response_headers: bool = False
    peer_picker_hash: str = "fnv1a-mix"
    """Ring hash: ``fnv1a-mix`` (default), or Gubernator's ``fnv1a`` / ``fnv1``; every node
    of a cluster must use the same one."""
    peer_picker_replicas: int = DEFAULT_REPLICAS
    grpc_server: str = "native"
    """gRPC server: ``native`` (libgrpc++ through the optional ``_native`` extension;
    ``threads`` when it is not built), ``threads`` (grpc.server on a thread pool) or
    ``asyncio`` (grpc.aio); the first two answer client checks owned here on the gRPC
    thread. See docs/cluster.md."""

    @property
    def advertise(self) -> str:
        return self.advertise_address or self.grpc_address

    def validate(self) -> ClusterConfig:
        if self.grpc_server not in GRPC_SERVERS:
            raise ConfigError(
                f"grpc_server must be one of {', '.join(GRPC_SERVERS)}, got {self.grpc_server!r}"
            )
        if self.peer_picker_hash not in HASHES:
            known = ", ".join(HASHES)
            raise ConfigError(
                f"peer_picker_hash must be one of {known}, got {self.peer_picker_hash!r}"
            )
        names = ("batch_limit", "global_batch_limit", "cache_size", "peer_down_after")
        for name in (*names, "peer_picker_replicas"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("batch_limit", "global_batch_limit"):
            if getattr(self, name) > 1000:  # a peer refuses calls of more than 1,000 items
                raise ConfigError(f"{name} must be <= 1000, got {getattr(self, name)!r}")
        for name in ("batch_wait_ms", "global_sync_wait_ms", "envoy_reload_interval_ms"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("batch_timeout_ms", "global_timeout_ms"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)!r}")
        return self


def _csv(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"must be true or false, got {text!r}")


def _int(name: str) -> Any:
    def conv(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"must be an integer, got {text!r}") from None

    return conv


# GUBER_* variable -> (config field, converter)
ENV: dict[str, tuple[str, Any]] = {
    "GUBER_GRPC_ADDRESS": ("grpc_address", str),
    "GUBER_HTTP_ADDRESS": ("http_address", str),
    "GUBER_ADVERTISE_ADDRESS": ("advertise_address", str),
    "GUBER_PEER_DISCOVERY_TYPE": ("peer_discovery", str),
    "GUBER_ETCD_ENDPOINTS": ("etcd_endpoints", _csv),
    "GUBER_ETCD_KEY_PREFIX": ("etcd_key_prefix", str),
    "GUBER_DNS_FQDN": ("dns_fqdn", str),
    "GUBER_K8S_NAMESPACE": ("k8s_namespace", str),
    "GUBER_K8S_POD_IP": ("k8s_pod_ip", str),
    "GUBER_K8S_POD_PORT": ("k8s_pod_port", str),
    "GUBER_K8S_ENDPOINTS_SELECTOR": ("k8s_selector", str),
    "GUBER_DATA_CENTER": ("data_center", str),
    "GUBER_BATCH_WAIT": ("batch_wait_ms", parse_duration_ms),
    "GUBER_BATCH_LIMIT": ("batch_limit", _int("GUBER_BATCH_LIMIT")),
    "GUBER_BATCH_TIMEOUT": ("batch_timeout_ms", parse_duration_ms),
    "GUBER_GLOBAL_SYNC_WAIT": ("global_sync_wait_ms", parse_duration_ms),
    "GUBER_GLOBAL_BATCH_LIMIT": ("global_batch_limit", _int("GUBER_GLOBAL_BATCH_LIMIT")),
    "GUBER_GLOBAL_TIMEOUT": ("global_timeout_ms", parse_duration_ms),
    "GUBER_CACHE_SIZE": ("cache_size", _int("GUBER_CACHE_SIZE")),
    "GUBER_PEERS": ("peers", _csv),
    "GUBER_PEER_PICKER_HASH": ("peer_picker_hash", str),
    "SMOCKRON_GRPC_SERVER": ("grpc_server", str),
    # envoyproxy/ratelimit's own variable, for the Envoy front
    "LIMIT_RESPONSE_HEADERS_ENABLED": ("envoy_response_headers", _bool),
    "GUBER_REPLICATED_HASH_REPLICAS": (
        "peer_picker_replicas",
        _int("GUBER_REPLICATED_HASH_REPLICAS"),
    ),
}


def from_env(env: Mapping[str, str], base: ClusterConfig | None = None) -> ClusterConfig:
    """``base`` (or the defaults) overridden by every GUBER_* variable that is set."""
    changes: dict[str, Any] = {}
    for var, (name, conv) in ENV.items():
        text = env.get(var)
        if text:
            try:
                changes[name] = conv(text)
            except ConfigError as exc:
                raise ConfigError(f"{var}: {exc}") from None
    return replace(base or ClusterConfig(), **changes)


FIELD_NAMES = frozenset(f.name for f in fields(ClusterConfig))
