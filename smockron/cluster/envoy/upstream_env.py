"""envoyproxy/ratelimit's own environment, for a node that replaces a running deployment.

A node is in *envoyproxy/ratelimit mode* when ``RUNTIME_ROOT`` or ``RUNTIME_SUBDIRECTORY``
is set and no ``--envoy-config`` (``SMOCKRON_CLUSTER_ENVOY_CONFIG``) names the descriptor
files: it then reads upstream's variables as upstream reads them (``UpstreamSettings``)
and serves what upstream serves, on upstream's ports. ``--envoy-config`` keeps smockron's
own Envoy front; the ``RUNTIME_*`` variables are then ignored, with a warning.

Each variable is parsed as upstream's ``envconfig`` parses it: booleans as Go's
``strconv.ParseBool``, integers in base 10, ``EXTRA_TAGS`` as ``k1:v1,k2:v2``, durations
in Go's syntax; a bad value is a ConfigError naming the variable. Settings smockron
cannot honour are refused (``refusals``) rather than ignored: a migration must not run
with a setting silently dropped.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from smockron.cluster.envoy.settings import _FALSE, _TRUE
from smockron.errors import ConfigError
from smockron.settings import parse_go_duration_ms

log = logging.getLogger("smockron.cluster.envoy")

MODE_VARIABLES = ("RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY")
"""Either one set (and no ``--envoy-config``) puts a node in envoyproxy/ratelimit mode."""


def upstream_mode(env: Mapping[str, str], envoy_config: str) -> bool:
    """Whether the node runs as envoyproxy/ratelimit (see the module's docstring)."""
    wanted = any(env.get(name) for name in MODE_VARIABLES)
    if wanted and envoy_config:
        log.warning(
            "--envoy-config %s names the descriptor files: RUNTIME_ROOT, "
            "RUNTIME_SUBDIRECTORY and envoyproxy/ratelimit's ports are ignored",
            envoy_config,
        )
    return wanted and not envoy_config


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """One Redis (``REDIS_*``, or ``REDIS_PERSECOND_*`` for second limits)."""

    socket_type: str = "unix"
    type: str = "single"
    url: str = "/var/run/nutcracker/ratelimit.sock"
    pool_size: int = 10
    auth: str = ""
    tls: bool = False
    sentinel_auth: str = ""
    timeout_s: float = 10.0
    tls_client_cert: str = ""
    tls_client_key: str = ""
    tls_cacert: str = ""
    tls_skip_hostname_verification: bool = False


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    runtime_root: str = "/srv/runtime_data/current"
    runtime_subdirectory: str = ""
    runtime_appdirectory: str = "config"
    runtime_watch_root: bool = True
    runtime_ignore_dotfiles: bool = False
    host: str = "0.0.0.0"
    port: int = 8080
    grpc_host: str = "0.0.0.0"
    grpc_port: int = 8081
    debug_host: str = "0.0.0.0"
    debug_port: int = 6070
    log_level: str = ""
    log_format: str = ""
    use_statsd: bool = True
    statsd_host: str = "localhost"
    statsd_port: int = 8125
    extra_tags: dict[str, str] = field(default_factory=dict)
    stats_flush_interval_s: float = 10.0
    disable_stats: bool = False
    use_prometheus: bool = False
    prometheus_addr: str = ":9090"
    prometheus_response_time_as_milliseconds: bool = False
    backend_type: str = "redis"
    cache_key_prefix: str = ""
    local_cache_size_in_bytes: int = 0
    stop_cache_key_increment_when_overlimit: bool = False
    expiration_jitter_max_seconds: int = 300
    healthy_with_at_least_one_config_loaded: bool = False
    redis: RedisSettings = field(default_factory=RedisSettings)
    redis_persecond: bool = False
    redis_persecond_settings: RedisSettings = field(default_factory=RedisSettings)
    redis_health_check_active_connection: bool = False

    @property
    def config_dir(self) -> Path:
        """Where the descriptor files are: ``RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/
        RUNTIME_APPDIRECTORY`` (with or without ``RUNTIME_WATCH_ROOT``, upstream loads the
        files under it)."""
        return Path(self.runtime_root, self.runtime_subdirectory, self.runtime_appdirectory)

    @property
    def grpc_address(self) -> str:
        return _join(self.grpc_host, self.grpc_port)

    @property
    def http_address(self) -> str:
        return _join(self.host, self.port)

    @property
    def debug_address(self) -> str:
        return _join(self.debug_host, self.debug_port)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> UpstreamSettings:
        env = os.environ if env is None else env
        d = cls()
        r = _Reader(env)
        return cls(
            runtime_root=r.text("RUNTIME_ROOT", d.runtime_root),
            runtime_subdirectory=r.text("RUNTIME_SUBDIRECTORY", d.runtime_subdirectory),
            runtime_appdirectory=r.text("RUNTIME_APPDIRECTORY", d.runtime_appdirectory),
            runtime_watch_root=r.flag("RUNTIME_WATCH_ROOT", d.runtime_watch_root),
            runtime_ignore_dotfiles=r.flag("RUNTIME_IGNOREDOTFILES", d.runtime_ignore_dotfiles),
            host=r.text("HOST", d.host),
            port=r.port("PORT", d.port),
            grpc_host=r.text("GRPC_HOST", d.grpc_host),
            grpc_port=r.port("GRPC_PORT", d.grpc_port),
            debug_host=r.text("DEBUG_HOST", d.debug_host),
            debug_port=r.port("DEBUG_PORT", d.debug_port),
            log_level=r.text("LOG_LEVEL", d.log_level),
            log_format=r.text("LOG_FORMAT", d.log_format),
            use_statsd=r.flag("USE_STATSD", d.use_statsd),
            statsd_host=r.text("STATSD_HOST", d.statsd_host),
            statsd_port=r.port("STATSD_PORT", d.statsd_port),
            extra_tags=r.tags("EXTRA_TAGS"),
            stats_flush_interval_s=r.duration("STATS_FLUSH_INTERVAL", d.stats_flush_interval_s),
            disable_stats=r.flag("DISABLE_STATS", d.disable_stats),
            use_prometheus=r.flag("USE_PROMETHEUS", d.use_prometheus),
            prometheus_addr=r.text("PROMETHEUS_ADDR", d.prometheus_addr),
            prometheus_response_time_as_milliseconds=r.flag(
                "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", False
            ),
            backend_type=r.text("BACKEND_TYPE", d.backend_type).lower(),
            cache_key_prefix=r.text("CACHE_KEY_PREFIX", d.cache_key_prefix),
            local_cache_size_in_bytes=r.number("LOCAL_CACHE_SIZE_IN_BYTES", 0, low=0),
            stop_cache_key_increment_when_overlimit=r.flag(
                "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", False
            ),
            expiration_jitter_max_seconds=r.number("EXPIRATION_JITTER_MAX_SECONDS", 300, low=0),
            healthy_with_at_least_one_config_loaded=r.flag(
                "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", False
            ),
            redis=_redis(r, "REDIS_", "/var/run/nutcracker/ratelimit.sock", "REDIS_"),
            redis_persecond=r.flag("REDIS_PERSECOND", False),
            redis_persecond_settings=_redis(
                r, "REDIS_PERSECOND_", "/var/run/nutcracker/ratelimitpersecond.sock", "REDIS_"
            ),
            redis_health_check_active_connection=r.flag(
                "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", False
            ),
        )


def _redis(r: _Reader, prefix: str, url: str, tls_prefix: str) -> RedisSettings:
    return RedisSettings(
        socket_type=r.text(f"{prefix}SOCKET_TYPE", "unix").lower(),
        type=r.text(f"{prefix}TYPE", "SINGLE").lower(),
        url=r.text(f"{prefix}URL", url),
        pool_size=r.number(f"{prefix}POOL_SIZE", 10, low=1),
        auth=r.text(f"{prefix}AUTH", ""),
        tls=r.flag(f"{prefix}TLS", False),
        sentinel_auth=r.text(f"{prefix}SENTINEL_AUTH", ""),
        timeout_s=r.duration(f"{prefix}TIMEOUT", 10.0),
        tls_client_cert=r.text(f"{tls_prefix}TLS_CLIENT_CERT", ""),
        tls_client_key=r.text(f"{tls_prefix}TLS_CLIENT_KEY", ""),
        tls_cacert=r.text(f"{tls_prefix}TLS_CACERT", ""),
        tls_skip_hostname_verification=r.flag(f"{tls_prefix}TLS_SKIP_HOSTNAME_VERIFICATION", False),
    )


_REFUSED_VALUES: dict[str, tuple[set[str], str]] = {
    "CONFIG_TYPE": ({"", "FILE"}, "only FILE (the runtime directory) is supported, not xDS"),
    "BACKEND_TYPE": (
        {"", "redis", "cluster"},
        "use redis (counts in Redis, shared with envoyproxy/ratelimit) or cluster (smockron's "
        "cluster counts); memcache is not supported",
    ),
}
_REFUSED_WHEN_TRUE = {
    "USE_DOG_STATSD": "DogStatsD tags are not supported; use USE_STATSD (plain statsd)",
}
_REFUSED_WHEN_SET = {
    "GRPC_UDS": "a Unix socket for gRPC is not supported; use GRPC_HOST and GRPC_PORT",
    "MEMCACHE_HOST_PORT": "memcache is not supported",
    "MEMCACHE_SRV": "memcache is not supported",
}


def refusals(env: Mapping[str, str]) -> list[str]:
    """One message per upstream setting smockron refuses (empty: none is set)."""
    out = []
    for name, (allowed, why) in _REFUSED_VALUES.items():
        value = env.get(name, "")
        if value not in allowed and value.lower() not in allowed:
            out.append(f"{name}={value}: {why}")
    for name, why in _REFUSED_WHEN_TRUE.items():
        if env.get(name, "") in _TRUE:
            out.append(f"{name}={env[name]}: {why}")
    for name, why in _REFUSED_WHEN_SET.items():
        if env.get(name):
            out.append(f"{name}={env[name]}: {why}")
    stop = env.get("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "")
    if env.get("BACKEND_TYPE", "").lower() == "cluster" and stop in _TRUE:
        out.append(
            f"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT={stop}: needs BACKEND_TYPE=redis "
            "(the cluster's counters do not count refused hits twice)"
        )
    return out


def warnings(env: Mapping[str, str]) -> list[str]:
    """Settings that are read but change nothing here, one line each."""
    out = []
    if env.get("BACKEND_TYPE", "").lower() == "cluster" and env.get("LOCAL_CACHE_SIZE_IN_BYTES"):
        out.append(
            "LOCAL_CACHE_SIZE_IN_BYTES has no effect with BACKEND_TYPE=cluster "
            "(it caches Redis answers)"
        )
    for name, why in _IGNORED.items():
        if env.get(name):
            out.append(f"{name} has no effect: {why}")
    return out


_IGNORED = {
    "TRACING_ENABLED": "smockron does not export OpenTelemetry traces",
    "GRPC_MAX_CONNECTION_AGE": "connections are not aged out",
    "GRPC_MAX_CONNECTION_AGE_GRACE": "connections are not aged out",
    "REDIS_PIPELINE_WINDOW": "each call sends its own pipeline at once",
    "REDIS_PERSECOND_PIPELINE_WINDOW": "each call sends its own pipeline at once",
    "REDIS_PIPELINE_LIMIT": "deprecated upstream too",
    "REDIS_PERSECOND_PIPELINE_LIMIT": "deprecated upstream too",
    "REDIS_CLUSTER_PIPELINE_PARALLELISM": "a cluster pipeline goes to every node at once",
    "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM": "a cluster pipeline goes to every node at once",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR": "a call always waits for a connection (upstream's WAIT)",
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR": "a call always waits for a connection",
    "PROMETHEUS_PATH": "the path is /metrics",
    "PROMETHEUS_MAPPER_YAML": "the Prometheus names are upstream's default mapping",
    "FORCE_START_WITHOUT_INITIAL_CONFIG": "the node always starts; without a configuration it "
    "answers 'no rate limit configuration loaded'",
    "REDIS_STARTUP_INITIAL_INTERVAL": "the node starts at once and retries Redis until it answers",
    "REDIS_STARTUP_MAX_INTERVAL": "the node starts at once and retries Redis until it answers",
    "REDIS_STARTUP_MAX_ELAPSED_TIME": "the node starts at once and retries Redis until it answers",
}


class _Reader:
    """Reads variables as upstream's ``envconfig``: empty means the default."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def text(self, name: str, default: str) -> str:
        return self.env.get(name) or default

    def flag(self, name: str, default: bool) -> bool:
        text = self.env.get(name, "")
        if not text:
            return default
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ConfigError(f"{name}: must be true or false, got {text!r}")

    def number(self, name: str, default: int, low: int | None = None) -> int:
        text = self.env.get(name, "").strip()
        if not text:
            return default
        try:
            value = int(text, 10)
        except ValueError:
            raise ConfigError(f"{name}: must be an integer, got {text!r}") from None
        if low is not None and value < low:
            raise ConfigError(f"{name}: must be at least {low}, got {text!r}")
        return value

    def port(self, name: str, default: int) -> int:
        value = self.number(name, default, low=0)
        if value > 65535:
            raise ConfigError(f"{name}: must be a port number (0-65535), got {value}")
        return value

    def duration(self, name: str, default_s: float) -> float:
        text = self.env.get(name, "").strip()
        if not text:
            return default_s
        try:
            return parse_go_duration_ms(text) / 1000.0
        except ConfigError as exc:
            raise ConfigError(f"{name}: {exc}") from None

    def tags(self, name: str) -> dict[str, str]:
        """``k1:v1,k2:v2`` (envconfig's map syntax)."""
        text = self.env.get(name, "")
        tags: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, value = item.partition(":")
            if not sep:
                raise ConfigError(f"{name}: invalid map item: {item!r} (want key:value)")
            tags[key] = value
        return tags


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
