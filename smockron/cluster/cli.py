"""``smockron cluster``: a Gubernator-compatible node.

Settings, first found wins: the flag; ``SMOCKRON_CLUSTER_<FLAG>``; Gubernator's ``GUBER_*``
variable (and envoyproxy/ratelimit's names for the Envoy front); the ``--config`` TOML
file; the default. ``--config`` may instead be Gubernator's own env file, whose variables
then count as set (over the environment's, as Gubernator's ``os.Setenv`` makes them). It
all lands in one ClusterConfig, built once (smockron/cluster/config.py). Duration flags
need a unit (``500us``, ``100ms``, ``1s``, ``1m30s``): a bare number once meant
milliseconds here and is now refused rather than reread; the ``GUBER_*`` variables keep
Gubernator's Go syntax.

The settings are built in smockron.cluster.build, the node run in smockron.cluster.run;
here the command: its flags, the ``--config`` file's two forms, logging.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from smockron import runtime
from smockron.cluster.build import build_config as build_config  # re-exported: the old home
from smockron.cluster.build import build_discovery as build_discovery
from smockron.cluster.build import printable
from smockron.cluster.config import CLIENT_AUTH_MODES, ClusterConfig
from smockron.cluster.guber_env import is_env_file, read_env_file
from smockron.cluster.metrics import ClusterMetrics
from smockron.cluster.run import envoy_front, reload, serve
from smockron.cluster.server import ClusterServer
from smockron.errors import ConfigError
from smockron.settings import (
    Duration,
    HostPort,
    SmockronCommand,
    metrics_option,
    print_settings_if_asked,
)

log = logging.getLogger("smockron.cluster")

_DURATION = Duration(bare=None, unit="ms")  # a bare number used to be ms: refused


def _chosen(name: str) -> bool:
    """Did ``--log-level``/``--log-format`` (either level) or SMOCKRON_LOG_* choose?"""
    if f"SMOCKRON_{name.upper()}" in os.environ:
        return True
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT):
            return True
        ctx = ctx.parent
    return False


def _apply_guber_logging(config: ClusterConfig) -> None:
    """GUBER_LOG_LEVEL / GUBER_DEBUG and GUBER_LOG_FORMAT (read into ``config``) apply
    unless smockron's own log options chose."""
    level = None if _chosen("log_level") else config.log_level or None
    fmt = None if _chosen("log_format") else config.log_format or None
    if fmt is not None:
        runtime.configure_logging(level or logging.getLevelName(logging.getLogger().level), fmt)
    elif level is not None:
        logging.getLogger().setLevel(level)


class ClusterCommand(SmockronCommand):
    """``--config`` takes smockron's TOML file or Gubernator's env file (``GUBER_*=value``
    lines), whose variables are then read as if set in the environment."""

    guber_file: dict[str, str] = {}

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        self.guber_file = {}
        ctx = super().make_context(*args, **kwargs)
        ctx.meta[_GUBER_FILE] = self.guber_file
        return ctx

    def load_file(self, path: Path) -> tuple[dict[str, Any], dict[str, str]]:
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
        if not is_env_file(text):
            return super().load_file(path)
        try:
            self.guber_file = read_env_file(text)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        return {}, {}


_GUBER_FILE = "smockron.cluster.guber_file"


@click.command("cluster", cls=ClusterCommand)
@click.option(
    "--grpc-address",
    type=HostPort(listen=True, optional=True),
    help="gRPC listen address [GUBER_GRPC_ADDRESS; 127.0.0.1:1051]",
)
@click.option(
    "--http-address",
    type=HostPort(listen=True, optional=True),
    help="HTTP listen address [GUBER_HTTP_ADDRESS; 127.0.0.1:1050]",
)
@click.option(
    "--status-http-address",
    type=HostPort(listen=True, optional=True),
    help="with TLS: HTTPS listener for /v1/HealthCheck without client certificates "
    "[GUBER_STATUS_HTTP_ADDRESS; off]",
)
@click.option(
    "--advertise-address",
    type=HostPort(optional=True),
    help="gRPC address peers use for this node [GUBER_ADVERTISE_ADDRESS; the gRPC address]",
)
@click.option(
    "--peer-address",
    type=HostPort(listen=True, optional=True),
    help="PeersV1 (node-to-node) listen address [the gRPC host, port + 1]",
)
@click.option(
    "--peers-on-grpc-port/--no-peers-on-grpc-port",
    default=None,
    help="serve PeersV1 on the gRPC port and call peers there, as Gubernator does "
    "(mixed Gubernator/smockron clusters; any gRPC client can then call PeersV1) [off]",
)
@click.option(
    "--peer-check-address/--no-peer-check-address",
    default=None,
    help="take PeersV1 calls only from the address of another member of the peer list [on]",
)
@click.option(
    "--peer-tls-names",
    help="names (DNS or IP SANs, comma-separated) of which a peer's client certificate "
    "must carry one for PeersV1 (TLS with require-and-verify) [any certificate of the CA]",
)
@click.option(
    "--peers",
    help="static peer list: gRPC addresses of every node, this one included; "
    "ADDRESS/PEER_ADDRESS (or ADDRESS/PORT) names a node's PeersV1 listener "
    "[gRPC port + 1]",
)
@click.option(
    "--peers-file",
    type=click.Path(dir_okay=False),
    help="static peers from a file, one --peers entry a line; re-read on SIGHUP and change",
)
@click.option(
    "--peer-discovery",
    type=click.Choice(["static", "etcd", "dns", "k8s", "kubernetes", "member-list"]),
    help="[GUBER_PEER_DISCOVERY_TYPE; static]",
)
@click.option("--etcd-endpoints", help="comma-separated host:port [GUBER_ETCD_ENDPOINTS]")
@click.option("--dns-fqdn", help="name whose A/AAAA records are the peers [GUBER_DNS_FQDN]")
@click.option("--k8s-namespace", help="[GUBER_K8S_NAMESPACE; default]")
@click.option(
    "--k8s-selector",
    help="label selector of the EndpointSlices [GUBER_K8S_SELECTOR; else those of "
    "GUBER_K8S_SERVICE_NAME]",
)
@click.option("--k8s-pod-ip", help="this pod's IP [GUBER_K8S_POD_IP]")
@click.option(
    "--batch-wait",
    "batch_wait_ms",
    type=_DURATION,
    help="how long forwards wait to fill a batch [GUBER_BATCH_WAIT; 500us]",
)
@click.option("--batch-limit", type=int, help="items per forwarded batch [GUBER_BATCH_LIMIT; 1000]")
@click.option(
    "--batch-timeout",
    "batch_timeout_ms",
    type=_DURATION,
    help="deadline of a peer call [GUBER_BATCH_TIMEOUT; 500ms]",
)
@click.option(
    "--global-sync-wait",
    "global_sync_wait_ms",
    type=_DURATION,
    help="GLOBAL hits/broadcast interval [GUBER_GLOBAL_SYNC_WAIT; 100ms]",
)
@click.option(
    "--global-batch-limit", type=int, help="keys per GLOBAL call [GUBER_GLOBAL_BATCH_LIMIT; 1000]"
)
@click.option(
    "--global-timeout",
    "global_timeout_ms",
    type=_DURATION,
    help="[GUBER_GLOBAL_TIMEOUT; 500ms]",
)
@click.option(
    "--global-mode",
    type=click.Choice(["lend", "gubernator"]),
    help="GLOBAL at non-owners: lend (each node spends only what its owner lends it) or "
    "gubernator (Gubernator's answers, and its over-admission) [SMOCKRON_GLOBAL_MODE; lend]",
)
@click.option("--cache-size", type=int, help="max rate limits kept [GUBER_CACHE_SIZE; 50000]")
@click.option(
    "--peer-down-after",
    type=int,
    help="failed peer calls in a row before the peer is routed around until it answers [3]",
)
@click.option(
    "--peer-picker-hash",
    type=click.Choice(["fnv1a-mix", "fnv1a", "fnv1"]),
    help="ring hash, the same on every node [GUBER_PEER_PICKER_HASH; fnv1a-mix]",
)
@click.option(
    "--grpc-server",
    type=click.Choice(["threads", "asyncio", "native"]),
    help="gRPC server implementation; native needs the libgrpc++ extension, else threads "
    "[SMOCKRON_GRPC_SERVER; native]",
)
@click.option(
    "--envoy-config",
    help="envoyproxy/ratelimit YAML file or directory: also serve "
    "envoy.service.ratelimit.v3.RateLimitService on the gRPC port",
)
@click.option(
    "--envoy-reload-interval",
    "envoy_reload_interval_ms",
    type=_DURATION,
    help="how often the Envoy config files are checked for changes; 0 = never [5s]",
)
@click.option(
    "--envoy-response-headers/--no-envoy-response-headers",
    default=None,
    help="add RateLimit-Limit/-Remaining/-Reset (renamed by LIMIT_*_HEADER) to Envoy answers "
    "[LIMIT_RESPONSE_HEADERS_ENABLED; off]",
)
@click.option("--tls-cert", help="server certificate (PEM) [GUBER_TLS_CERT]; turns TLS on")
@click.option("--tls-key", help="its private key (PEM) [GUBER_TLS_KEY]")
@click.option("--tls-ca", help="CA that peers' certificates chain to [GUBER_TLS_CA]")
@click.option("--tls-ca-key", help="the CA's key, to sign an auto certificate [GUBER_TLS_CA_KEY]")
@click.option(
    "--tls-auto/--no-tls-auto",
    default=None,
    help="generate a CA (unless --tls-ca/--tls-ca-key) and a server certificate at start "
    "[GUBER_TLS_AUTO; off]",
)
@click.option(
    "--tls-client-auth",
    type=click.Choice(CLIENT_AUTH_MODES[1:]),
    help="ask clients for a certificate [GUBER_TLS_CLIENT_AUTH; none]",
)
@click.option(
    "--tls-client-auth-ca-cert",
    help="CA client certificates must chain to [GUBER_TLS_CLIENT_AUTH_CA_CERT; --tls-ca]",
)
@click.option(
    "--tls-client-auth-cert",
    help="certificate shown to peers [GUBER_TLS_CLIENT_AUTH_CERT; --tls-cert]",
)
@click.option("--tls-client-auth-key", help="its key [GUBER_TLS_CLIENT_AUTH_KEY; --tls-key]")
@click.option(
    "--tls-client-auth-server-name",
    help="name expected in peers' certificates [GUBER_TLS_CLIENT_AUTH_SERVER_NAME; the host]",
)
@click.option(
    "--tls-insecure-skip-verify/--no-tls-insecure-skip-verify",
    default=None,
    help="[GUBER_TLS_INSECURE_SKIP_VERIFY; off] see docs/cluster.md, TLS",
)
@click.option(
    "--tls-min-version",
    type=click.Choice(["1.0", "1.1", "1.2", "1.3"]),
    help="least TLS version of the HTTP gateway [GUBER_TLS_MIN_VERSION; 1.3]",
)
@metrics_option("Also serve /metrics, /healthz, /readyz here.")
def cluster(**flags: Any) -> None:
    """Run a Gubernator-compatible rate-limit node (gRPC V1/PeersV1 + HTTP/JSON).

    Each flag may also come from SMOCKRON_CLUSTER_<FLAG>, then Gubernator's GUBER_*
    variable, then the --config TOML file. SIGHUP reloads the TLS files, the Envoy
    descriptor files and the peers file.
    """
    ctx = click.get_current_context()
    env = {**os.environ, **ctx.meta.get(_GUBER_FILE, {})}
    from_file = ParameterSource.DEFAULT_MAP
    given = {k: v for k, v in flags.items() if ctx.get_parameter_source(k) != from_file}
    filed = {k: v for k, v in flags.items() if ctx.get_parameter_source(k) == from_file}
    config = build_config(env, given, filed)
    _apply_guber_logging(config)
    config, front = envoy_front(config, env, {**filed, **given})
    print_settings_if_asked(printable(config))
    for line in config.ignored:
        log.warning("%s", line)
    metrics = ClusterMetrics()
    try:
        discovery = build_discovery(config, metrics.registry)
    except (OSError, ValueError) as exc:  # the peers file
        raise click.ClickException(str(exc)) from None
    try:  # the values are checked; what fails now is reading files (TLS): a startup failure
        server = ClusterServer(config, discovery, () if front is None else (front,), metrics)
    except (ConfigError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    facts = {
        "grpc": config.grpc_address,
        "http": config.http_address,
        "server": server.config.grpc_server,  # what runs (native may fall back to threads)
        "discovery": config.peer_discovery,
        "tls": "on" if config.tls else "off",
        "global_mode": config.global_mode,
        "envoy": "on" if front is not None else "off",
        **(front.facts() if hasattr(front, "facts") else {}),
    }
    runtime.run(
        lambda stop: serve(server, front, stop, facts, metrics=flags.get("metrics")),
        name="cluster",
        reload=lambda: reload(server, front, discovery),
    )
