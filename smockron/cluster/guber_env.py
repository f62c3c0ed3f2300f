"""Gubernator's GUBER_* variables (and ``--config`` env files) read into a ClusterConfig:
which variable sets which field, which are refused or have no effect, and the logging
ones the command line applies. The configuration itself is in smockron/cluster/config.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from smockron.cluster.config import (
    DISCOVERY_TYPES,
    K8S_MECHANISMS,
    ClusterConfig,
    k8s_mechanism_error,
    with_changes,
)
from smockron.errors import ConfigError
from smockron.settings import parse_go_duration_ms


def _csv(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "t", "true", "yes", "on"):
        return True
    if value in ("0", "f", "false", "no", "off"):
        return False
    raise ConfigError(f"must be true or false, got {text!r}")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"must be an integer, got {text!r}") from None


def _discovery_type(text: str) -> str:
    kind = text.strip().lower()
    kind = "k8s" if kind == "kubernetes" else kind
    if kind not in DISCOVERY_TYPES:
        raise ConfigError(f"is invalid; choices are [{','.join(DISCOVERY_TYPES)}]")
    return kind


def _peer_picker(text: str) -> None:
    if text.strip() != "replicated-hash":
        raise ConfigError(f"{text!r} is invalid; choices are ['replicated-hash']")


def _seconds_ms(text: str) -> float:
    return _int(text) * 1000.0


# GUBER_* variable -> (config field, "pool.field" for a discovery pool, converter); a
# converter returning None only checks the value.
ENV: dict[str, tuple[str, Any]] = {
    "GUBER_GRPC_ADDRESS": ("grpc_address", str),
    "GUBER_HTTP_ADDRESS": ("http_address", str),
    "GUBER_STATUS_HTTP_ADDRESS": ("status_http_address", str),
    "GUBER_ADVERTISE_ADDRESS": ("advertise_address", str),
    "GUBER_PEER_DISCOVERY_TYPE": ("peer_discovery", _discovery_type),
    "GUBER_ETCD_ENDPOINTS": ("etcd.endpoints", _csv),
    "GUBER_ETCD_KEY_PREFIX": ("etcd.key_prefix", str),
    "GUBER_ETCD_ADVERTISE_ADDRESS": ("etcd.advertise_address", str),
    "GUBER_ETCD_DATA_CENTER": ("etcd.data_center", str),
    "GUBER_ETCD_USER": ("etcd.username", str),
    "GUBER_ETCD_PASSWORD": ("etcd.password", str),
    "GUBER_ETCD_DIAL_TIMEOUT": ("etcd.dial_timeout_ms", parse_go_duration_ms),
    "GUBER_DNS_FQDN": ("dns.fqdn", str),
    "GUBER_RESOLV_CONF": ("dns.resolv_conf", str),
    "GUBER_K8S_NAMESPACE": ("k8s.namespace", str),
    "GUBER_K8S_POD_IP": ("k8s.pod_ip", str),
    "GUBER_K8S_POD_PORT": ("k8s.pod_port", str),
    "GUBER_K8S_ENDPOINTS_SELECTOR": ("k8s.selector", str),  # deprecated; GUBER_K8S_SELECTOR wins
    "GUBER_K8S_SELECTOR": ("k8s.selector", str),
    "GUBER_K8S_SERVICE_NAME": ("k8s.service_name", str),
    "GUBER_K8S_WATCH_MECHANISM": ("k8s.mechanism", str.lower),
    "GUBER_MEMBERLIST_ADDRESS": ("member_list.address", str),
    "GUBER_MEMBERLIST_BIND_ADDRESS": ("member_list.bind_address", str),
    "GUBER_MEMBERLIST_ADVERTISE_ADDRESS": ("member_list.advertise_address", str),
    "GUBER_MEMBERLIST_KNOWN_NODES": ("member_list.known_nodes", _csv),
    "GUBER_MEMBERLIST_NODE_NAME": ("member_list.node_name", str),
    "GUBER_MEMBERLIST_SECRET_KEYS": ("member_list.secret_keys", _csv),
    "GUBER_MEMBERLIST_GOSSIP_VERIFY_INCOMING": ("member_list.gossip_verify_incoming", _bool),
    "GUBER_MEMBERLIST_GOSSIP_VERIFY_OUTGOING": ("member_list.gossip_verify_outgoing", _bool),
    "GUBER_DATA_CENTER": ("data_center", str),
    "GUBER_BATCH_WAIT": ("batch_wait_ms", parse_go_duration_ms),
    "GUBER_BATCH_LIMIT": ("batch_limit", _int),
    "GUBER_BATCH_TIMEOUT": ("batch_timeout_ms", parse_go_duration_ms),
    "GUBER_GLOBAL_SYNC_WAIT": ("global_sync_wait_ms", parse_go_duration_ms),
    "GUBER_GLOBAL_BATCH_LIMIT": ("global_batch_limit", _int),
    "GUBER_GLOBAL_TIMEOUT": ("global_timeout_ms", parse_go_duration_ms),
    "GUBER_CACHE_SIZE": ("cache_size", _int),
    "GUBER_PEERS": ("peers", _csv),
    "GUBER_PEER_PICKER": ("", _peer_picker),
    "GUBER_PEER_PICKER_HASH": ("peer_picker_hash", str),
    "GUBER_REPLICATED_HASH_REPLICAS": ("peer_picker_replicas", _int),
    "GUBER_GRACEFUL_TERMINATION_DELAY_SEC": ("graceful_termination_delay_ms", _seconds_ms),
    "SMOCKRON_GRPC_SERVER": ("grpc_server", str),
    "SMOCKRON_GLOBAL_MODE": ("global_mode", str),
    # envoyproxy/ratelimit's own variable, for the Envoy front
    "LIMIT_RESPONSE_HEADERS_ENABLED": ("envoy_response_headers", _bool),
    "GUBER_TLS_CA": ("tls_ca", str),
    "GUBER_TLS_CA_KEY": ("tls_ca_key", str),
    "GUBER_TLS_CERT": ("tls_cert", str),
    "GUBER_TLS_KEY": ("tls_key", str),
    "GUBER_TLS_AUTO": ("tls_auto", _bool),
    "GUBER_TLS_CLIENT_AUTH": ("tls_client_auth", str),
    "GUBER_TLS_CLIENT_AUTH_CA_CERT": ("tls_client_auth_ca_cert", str),
    "GUBER_TLS_CLIENT_AUTH_CERT": ("tls_client_auth_cert", str),
    "GUBER_TLS_CLIENT_AUTH_KEY": ("tls_client_auth_key", str),
    "GUBER_TLS_CLIENT_AUTH_SERVER_NAME": ("tls_client_auth_server_name", str),
    "GUBER_TLS_INSECURE_SKIP_VERIFY": ("tls_insecure_skip_verify", _bool),
    "GUBER_TLS_MIN_VERSION": ("tls_min_version", str),
}

LOGGING_ENV = ("GUBER_LOG_FORMAT", "GUBER_LOG_LEVEL", "GUBER_DEBUG")
"""Read into ``log_level`` and ``log_format``, which the command line applies."""

_GUBER_LEVELS = {
    "trace": "DEBUG",
    "debug": "DEBUG",
    "info": "INFO",
    "warn": "WARNING",
    "warning": "WARNING",
    "error": "ERROR",
    "fatal": "CRITICAL",
    "panic": "CRITICAL",
}
"""logrus's level names (Gubernator's GUBER_LOG_LEVEL) as logging's."""


def guber_log_level(env: Mapping[str, str]) -> str | None:
    """Gubernator's GUBER_DEBUG / GUBER_LOG_LEVEL as a logging level name, or None."""
    if env.get("GUBER_DEBUG", "").lower() in ("1", "t", "true", "yes", "on"):
        return "DEBUG"
    text = env.get("GUBER_LOG_LEVEL", "").strip()
    if not text:
        return None
    level = _GUBER_LEVELS.get(text.lower())
    if level is None:
        known = ", ".join(_GUBER_LEVELS)
        raise ConfigError(f"GUBER_LOG_LEVEL: unknown level {text!r} ({known})")
    return level


def _logging(env: Mapping[str, str]) -> dict[str, str]:
    fmt = env.get("GUBER_LOG_FORMAT", "").strip()
    if fmt not in ("", "json", "text"):
        raise ConfigError("GUBER_LOG_FORMAT is invalid; expected value is either json or text")
    return {"log_level": guber_log_level(env) or "", "log_format": fmt}


REFUSED: dict[str, str] = {
    "GUBER_FORCE_GLOBAL": "GLOBAL behaviour forced on every check",
    "GUBER_GRPC_MAX_CONN_AGE_SEC": "a maximum gRPC connection age",
    "GUBER_ETCD_TLS_ENABLE": "etcd over TLS",
    "GUBER_ETCD_TLS_CERT": "etcd over TLS",
    "GUBER_ETCD_TLS_KEY": "etcd over TLS",
    "GUBER_ETCD_TLS_CA": "etcd over TLS",
    "GUBER_ETCD_TLS_SKIP_VERIFY": "etcd over TLS",
}
"""Gubernator settings smockron does not implement: set (to anything but empty, 0 or
false), the node refuses to start rather than run without them."""

IGNORED: dict[str, str] = {
    "GUBER_WORKER_COUNT": "smockron has no worker pool to size",
    "GUBER_INSTANCE_ID": "smockron's log lines do not carry an instance id",
    "GUBER_METRIC_FLAGS": "smockron always exports its process and Python collectors",
    "GUBER_TRACING_LEVEL": "smockron does not emit OpenTelemetry traces",
}
"""Gubernator settings that change neither answers nor membership: accepted, with one
warning line at start naming each that is set."""

_INERT = ("", "0", "f", "false")


def refused(env: Mapping[str, str]) -> None:
    """ConfigError (one line) for the first Gubernator setting smockron cannot honour."""
    for var, what in REFUSED.items():
        if env.get(var, "").strip().lower() not in _INERT:
            raise ConfigError(
                f"{var} is set, but smockron does not implement {what}: "
                "unset it, or keep this node on Gubernator"
            )
    mechanism = env.get("GUBER_K8S_WATCH_MECHANISM", "").strip().lower()
    if mechanism and mechanism not in K8S_MECHANISMS:
        raise ConfigError(k8s_mechanism_error(mechanism))


def warnings(env: Mapping[str, str]) -> list[str]:
    """One line for each GUBER_* variable that is set and has no effect here."""
    known = {*ENV, *LOGGING_ENV, *REFUSED, "GUBER_DISABLE_BATCHING"}
    lines = [f"{var} has no effect: {why}" for var, why in IGNORED.items() if env.get(var)]
    if env.get("GUBER_K8S_ENDPOINTS_SELECTOR") and not env.get("GUBER_K8S_SELECTOR"):
        lines.append("GUBER_K8S_ENDPOINTS_SELECTOR is deprecated, use GUBER_K8S_SELECTOR instead")
    for var in sorted(v for v in env if v.startswith("GUBER_") and v not in known):
        if var not in IGNORED and var not in NOT_READ_BY_NODES:
            lines.append(f"{var} is not a Gubernator server setting: ignored (a typo?)")
    return lines


NOT_READ_BY_NODES = frozenset({"GUBER_HTTP_RETRY_COUNT"})
"""Read by Gubernator's clients, not its servers."""

# envoyproxy/ratelimit's TLS variables, read when GRPC_SERVER_USE_TLS is true; the
# GUBER_TLS_* ones win. A client CA there means clients must show a certificate it signed
# (and, with GRPC_CLIENT_TLS_SAN, one valid for that name).
ENVOY_TLS_ENV: dict[str, tuple[str, Any]] = {
    "GRPC_SERVER_TLS_CERT": ("tls_cert", str),
    "GRPC_SERVER_TLS_KEY": ("tls_key", str),
    "GRPC_CLIENT_TLS_CACERT": ("tls_client_auth_ca_cert", str),
    "GRPC_CLIENT_TLS_SAN": ("tls_client_san", str),
}


def _envoy_tls(env: Mapping[str, str]) -> dict[str, Any]:
    text = env.get("GRPC_SERVER_USE_TLS")
    try:
        if not text or not _bool(text):
            return {}
    except ConfigError as exc:
        raise ConfigError(f"GRPC_SERVER_USE_TLS: {exc}") from None
    changes = {name: env[var] for var, (name, _) in ENVOY_TLS_ENV.items() if env.get(var)}
    if "tls_client_auth_ca_cert" in changes:
        changes["tls_client_auth"] = "require-and-verify"
    if not (changes.get("tls_cert") and changes.get("tls_key")):
        raise ConfigError("GRPC_SERVER_USE_TLS needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY")
    return changes


def _converted(env: Mapping[str, str]) -> dict[str, Any]:
    """The ClusterConfig changes of the variables of ``ENV`` that are set, converted (a
    bad value named by its variable)."""
    changes: dict[str, Any] = {}
    for var, (name, conv) in ENV.items():
        text = env.get(var)
        if text:
            try:
                value = conv(text)
            except ConfigError as exc:
                raise ConfigError(f"{var}: {exc}") from None
            if name:
                changes[name] = value
    return changes


def from_env(env: Mapping[str, str], base: ClusterConfig | None = None) -> ClusterConfig:
    """``base`` (or the defaults) overridden by every GUBER_* variable that is set.

    As Gubernator: with GUBER_PEER_DISCOVERY_TYPE unset, any GUBER_MEMBERLIST_* variable
    means member-list discovery (Gubernator's default), never a node alone.
    """
    refused(env)
    changes: dict[str, Any] = _envoy_tls(env)
    k8s = tuple(sorted(var for var in env if var.startswith("GUBER_K8S_") and env[var]))
    if k8s:
        changes["k8s.given"] = k8s
    changes.update(_converted(env))
    try:
        if _bool(env.get("GUBER_DISABLE_BATCHING") or "false"):
            changes["batch_wait_ms"] = 0.0
    except ConfigError as exc:
        raise ConfigError(f"GUBER_DISABLE_BATCHING: {exc}") from None
    if env.get("GUBER_PEER_PICKER") and not env.get("GUBER_PEER_PICKER_HASH"):
        changes["peer_picker_hash"] = "fnv1a"  # Gubernator's replicated-hash default
    changes.update(_logging(env), ignored=tuple(warnings(env)))
    memberlist = any(v.startswith("GUBER_MEMBERLIST_") and env[v] for v in env)
    if memberlist and not changes.get("member_list.known_nodes"):
        raise ConfigError(
            "when using `member-list` for peer discovery, you MUST provide a "
            "hostname of a known host in the cluster via "
            "`GUBER_MEMBERLIST_KNOWN_NODES`"
        )
    if "peer_discovery" not in changes and memberlist:
        changes["peer_discovery"] = "member-list"
    return with_changes(base or ClusterConfig(), changes)


_ENV_LINE = re.compile(r"[A-Z][A-Z0-9_]*\s*=")


def is_env_file(text: str) -> bool:
    """Is this Gubernator's ``--config`` file (``GUBER_NAME=value`` lines) rather than a
    TOML one (whose keys are lower-case option names)? Its first setting line says."""
    for line in text.split("\n"):
        if line and not line.startswith(("#", " ", "\t")):
            return _ENV_LINE.match(line) is not None
    return False


def read_env_file(text: str) -> dict[str, str]:
    """Gubernator's ``fromEnvFile``: ``KEY=VALUE`` lines, both sides trimmed, no quoting;
    lines that are empty or start with ``#``, a space or a tab are skipped; any other line
    without ``=`` is an error. The values then win over the environment, as Gubernator's
    ``os.Setenv`` of each line does."""
    env: dict[str, str] = {}
    for number, line in enumerate(text.split("\n"), 1):
        if not line or line.startswith(("#", " ", "\t")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ConfigError(f"malformed key=value on line {number}: {line[:80]!r}")
        env[key.strip()] = value.strip()
    return env
