"""``smockron cluster``: a Gubernator-compatible node.

Settings, first found wins: the flag; ``SMOCKRON_CLUSTER_<FLAG>``; Gubernator's ``GUBER_*``
variable (and envoyproxy/ratelimit's names for the Envoy front); the ``--config`` TOML
file; the default. ``--config`` may instead be Gubernator's own env file, whose variables
then count as set (over the environment's, as Gubernator's ``os.Setenv`` makes them). It
all lands in one ClusterConfig, built once (smockron/cluster/config.py). Duration flags
need a unit (``500us``, ``100ms``, ``1s``, ``1m30s``): a bare number once meant
milliseconds here and is now refused rather than reread; the ``GUBER_*`` variables keep
Gubernator's Go syntax.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from prometheus_client import CollectorRegistry

from smockron import runtime
from smockron.cluster.config import CLIENT_AUTH_MODES, ClusterConfig, with_changes
from smockron.cluster.discovery import make_discovery, options
from smockron.cluster.discovery.base import Discovery, PeerInfo
from smockron.cluster.guber_env import from_env, is_env_file, read_env_file
from smockron.cluster.metrics import ClusterMetrics
from smockron.cluster.node import Node
from smockron.cluster.server import ClusterServer, GrpcServer
from smockron.cluster.transports.http import observe
from smockron.errors import ConfigError
from smockron.settings import (
    WILDCARD_HOSTS,
    Duration,
    HostPort,
    SmockronCommand,
    metrics_option,
    parse_host_port,
    print_settings_if_asked,
)

log = logging.getLogger("smockron.cluster")

# flag (click parameter name) -> the discovery pool field it sets
_DISCOVERY_FLAGS = {
    "etcd_endpoints": "etcd.endpoints",
    "dns_fqdn": "dns.fqdn",
    "k8s_namespace": "k8s.namespace",
    "k8s_selector": "k8s.selector",
    "k8s_pod_ip": "k8s.pod_ip",
}


_DURATION = Duration(bare=None, unit="ms")  # a bare number used to be ms: refused
_FIELDS = frozenset(f.name for f in fields(ClusterConfig))


def _changes(values: Mapping[str, Any]) -> dict[str, Any]:
    """Flag values (click's, already converted) as ClusterConfig changes (with_changes)."""
    changes = {k: v for k, v in values.items() if v is not None and k in _FIELDS}
    for flag, path in _DISCOVERY_FLAGS.items():
        if values.get(flag):
            changes[path] = values[flag]
    if values.get("peers"):
        changes["peers"] = _addresses(values["peers"], "peers", peer_suffix=True)
    if values.get("etcd_endpoints"):
        changes["etcd.endpoints"] = _addresses(values["etcd_endpoints"], "etcd endpoints")
    if changes.get("peer_discovery") == "kubernetes":
        changes["peer_discovery"] = "k8s"
    return changes


def _addresses(text: str, what: str, peer_suffix: bool = False) -> tuple[str, ...]:
    """A comma-separated list of HOST:PORT, each checked; with ``peer_suffix`` each may
    end in ``/HOST:PORT`` or ``/PORT`` (where that node serves PeersV1)."""
    items = tuple(p.strip() for p in str(text).split(",") if p.strip())
    for item in items:
        address, sep, peer = item.partition("/") if peer_suffix else (item, "", "")
        try:
            parse_host_port(address)
            if sep and not peer.isdigit():
                parse_host_port(peer)
        except ConfigError as exc:
            raise ConfigError(f"{what}: {exc}") from None
    return items


def build_config(
    env: Mapping[str, str], flags: Mapping[str, Any], file: Mapping[str, Any] | None = None
) -> ClusterConfig:
    """The one settings object: defaults, then the ``file`` values, then ``GUBER_*``
    (``env``, read once), then ``flags`` (the command line and ``SMOCKRON_CLUSTER_*``)."""
    base = with_changes(ClusterConfig(), _changes(file or {}))
    config = with_changes(from_env(env, base), _changes(flags))
    return replace(config, **_listen_everywhere(config)).validate()


def _listen_everywhere(config: ClusterConfig) -> dict[str, Any]:
    """Go-style ``:1051`` listens on all interfaces; peers then need a dialable address.

    As Gubernator does, the advertised address defaults to this host's IP when the gRPC
    address is a wildcard and GUBER_ADVERTISE_ADDRESS is not set.
    """
    host, sep, port = config.grpc_address.rpartition(":")
    if not sep or host not in WILDCARD_HOSTS:
        return {}
    changes: dict[str, Any] = {
        "grpc_address": f"0.0.0.0:{port}" if host in ("", "*") else config.grpc_address
    }
    if not config.advertise_address:
        try:
            ip = socket.gethostbyname(socket.gethostname())
        except OSError:
            ip = "127.0.0.1"
        changes["advertise_address"] = f"{ip}:{port}"
    return changes


def build_discovery(config: ClusterConfig, registry: CollectorRegistry | None = None) -> Discovery:
    """The mechanism ``config`` names, from its settings alone; ``registry``: the node's,
    for the discovery counters."""
    me = PeerInfo(config.advertise, config.http_address, config.data_center, config.advertise_peer)
    kind = config.peer_discovery
    if config.peers_file:
        if kind not in ("static", "none") or config.peers:
            raise ConfigError("peers_file is a static peer list: it excludes --peers and "
                              f"--peer-discovery {kind}")  # fmt: skip
        return make_discovery("file", path=config.peers_file, advertise=me)
    found = options(config, me)
    if found is None:
        return make_discovery("static", peers=list(config.peers) or [me.grpc_address], advertise=me)
    return make_discovery(found[0], **found[1], registry=registry)


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


def _printable(config: ClusterConfig) -> dict[str, Any]:
    """The settings for --print-settings, secrets masked."""
    values = {f: getattr(config, f) for f in sorted(_FIELDS)}
    if config.etcd.password:
        values["etcd"] = replace(config.etcd, password="***")
    if config.member_list.secret_keys:
        values["member_list"] = replace(config.member_list, secret_keys=("***",))
    return values


class EnvoyFront:
    """The Envoy RLS front on the node's gRPC server; its descriptor files are reloaded
    when they change (as envoyproxy/ratelimit does), every ``reload_interval`` seconds."""

    def __init__(self, paths: str, reload_interval: float, headers: bool = False) -> None:
        from smockron.cluster import envoy

        self._envoy = envoy
        self.paths = paths
        self.loaded = envoy.load_config(paths)  # a bad file stops the command at start
        self.reload_interval = reload_interval
        self.headers = headers
        self._task: asyncio.Task[None] | None = None
        self._reloader: Any = None

    def __call__(self, server: GrpcServer, node: Node) -> None:
        servicer = self._envoy.add_to_server(
            server, node, self.loaded, response_headers=self.headers
        )
        self._reloader = self._envoy.ConfigReloader(servicer, self.paths, self.reload_interval)
        if self.reload_interval > 0:
            self._task = asyncio.get_running_loop().create_task(self._reloader.run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def reload(self) -> None:
        """SIGHUP: check the descriptor files now rather than at the next poll."""
        if self._reloader is not None and not self._reloader.check():
            log.info("envoy: SIGHUP: the descriptor files are unchanged")

    async def start(self) -> None:
        """Nothing beyond the gRPC port (UpstreamFront starts its listeners here)."""


def _envoy_front(
    config: ClusterConfig, env: Mapping[str, str], given: Mapping[str, Any]
) -> tuple[ClusterConfig, Any]:
    """The Envoy front, if any: ``--envoy-config``'s, or envoyproxy/ratelimit mode's
    (envoy/upstream_env.py), whose GRPC_HOST:GRPC_PORT is the gRPC address unless one was
    given (flag, SMOCKRON_CLUSTER_GRPC_ADDRESS, GUBER_GRPC_ADDRESS, the --config file)."""
    from smockron.cluster.envoy.upstream_env import upstream_mode

    if upstream_mode(env, config.envoy_config):
        from smockron.cluster.envoy.upstream import UpstreamFront, apply_logging
        from smockron.cluster.envoy.upstream_env import UpstreamSettings

        settings = UpstreamSettings.from_env(env)
        apply_logging(settings, env)
        if given.get("grpc_address") is None and not env.get("GUBER_GRPC_ADDRESS"):
            config = replace(config, grpc_address=settings.grpc_address)
            config = replace(config, **_listen_everywhere(config)).validate()
        interval = config.envoy_reload_interval_ms / 1000
        front = UpstreamFront(settings, interval, env, config.envoy_response_headers)
        return config, front
    if not config.envoy_config:
        return config, None
    return config, EnvoyFront(
        config.envoy_config,
        config.envoy_reload_interval_ms / 1000,
        headers=config.envoy_response_headers,
    )


async def serve(
    server: ClusterServer,
    front: Any = None,
    stop: asyncio.Event | None = None,
    facts: Mapping[str, Any] | None = None,
    metrics: str | None = None,
) -> None:
    """Start, serve until ``stop`` (the runtime's SIGTERM/SIGINT), then stop cleanly."""
    stop = stop or asyncio.Event()
    try:
        await server.start()
    except OSError as exc:
        if front is not None:
            await front.close()
        await server.stop()
        raise click.ClickException(str(exc)) from None
    runtime.startup_line("cluster", **(facts or {}))
    listener = None
    try:
        if front is not None:
            try:
                await front.start()
            except OSError as exc:
                raise click.ClickException(str(exc)) from None
        runtime.announce(f"smockron cluster: node {server.node.address} serving")
        if metrics:
            try:
                listener = observe(server.node, metrics)
            except ConfigError as exc:
                raise click.ClickException(str(exc)) from None
        await stop.wait()
        if hasattr(front, "stopping"):
            front.stopping()  # envoyproxy/ratelimit's health check fails from SIGTERM on
        await _drain(server.config.graceful_termination_delay_ms / 1000)
    finally:
        log.info("shutting down")
        if listener is not None:
            listener.close()
        if front is not None:
            await front.close()
        await server.stop()


async def _drain(delay: float) -> None:
    """GUBER_GRACEFUL_TERMINATION_DELAY_SEC: keep serving a while after SIGTERM."""
    if delay > 0:
        log.info("graceful termination: serving %.0f s more before stopping", delay)
        await asyncio.sleep(delay)


def _reload(server: ClusterServer, front: Any, discovery: Discovery) -> None:
    """SIGHUP: the TLS certificate and key files, the Envoy descriptor files, and the
    peers file."""
    server.reload_tls()
    if front is not None:
        front.reload()
    reload = getattr(discovery, "reload", None)
    if reload is not None:
        reload()


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
    config, front = _envoy_front(config, env, {**filed, **given})
    print_settings_if_asked(_printable(config))
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
        reload=lambda: _reload(server, front, discovery),
    )
