"""Configuration of a cluster node: its settings, their defaults and checks (the GUBER_*
variables are read in smockron/cluster/guber_env.py).

Flags and ``SMOCKRON_CLUSTER_*`` win over the ``GUBER_*`` variables, which win over the
``--config`` file, then the defaults here; the defaults are Gubernator's (batch wait
500 us, batch limit 1,000, global sync wait 100 ms...). See smockron/cluster/cli.py.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from smockron.cluster.model import MAX_BATCH
from smockron.core.hashring import DEFAULT_REPLICAS, HASHES
from smockron.errors import ConfigError
from smockron.settings import WILDCARD_HOSTS

GRPC_SERVERS = ("threads", "asyncio", "native")
GLOBAL_MODES = ("lend", "gubernator")
CLIENT_AUTH_MODES = ("", "request-cert", "verify-cert", "require-any-cert", "require-and-verify")
"""GUBER_TLS_CLIENT_AUTH values (Go's tls.ClientAuthType, named as Gubernator names them)."""
TLS_VERSIONS = ("1.0", "1.1", "1.2", "1.3")
DISCOVERY_TYPES = ("static", "etcd", "dns", "k8s", "member-list", "none")
K8S_MECHANISMS = ("endpointslices", "endpoints")
"""GUBER_K8S_WATCH_MECHANISM values smockron follows (``endpoints`` means EndpointSlices
in Gubernator too); Gubernator's ``pods`` is refused."""


def k8s_mechanism_error(value: str) -> str:
    """The one line for a GUBER_K8S_WATCH_MECHANISM smockron does not follow: Gubernator's
    ``pods``, or a value Gubernator refuses too (its message names both choices)."""
    if value == "pods":
        return (
            f"GUBER_K8S_WATCH_MECHANISM={value}: smockron watches EndpointSlices only "
            "(endpointslices): name the Service in GUBER_K8S_SERVICE_NAME"
        )
    return (
        f"GUBER_K8S_WATCH_MECHANISM={value}: needs to be either 'endpointslices' or "
        "'pods' (defaults to 'endpointslices'); smockron follows 'endpointslices'"
    )


@dataclass(frozen=True, slots=True)
class EtcdPoolConfig:
    """Gubernator's EtcdPoolConfig (GUBER_ETCD_*)."""

    endpoints: tuple[str, ...] = ("127.0.0.1:2379",)
    key_prefix: str = "/gubernator-peers"
    advertise_address: str = ""
    """The gRPC address the record names; "" = the node's advertised one."""
    data_center: str | None = None
    """The record's data center; None = the node's."""
    username: str = ""
    password: str = field(default="", repr=False)
    dial_timeout_ms: float = 5000.0


@dataclass(frozen=True, slots=True)
class K8sPoolConfig:
    """Gubernator's K8sPoolConfig (GUBER_K8S_*): EndpointSlices of ``service_name``, or
    those ``selector`` selects."""

    namespace: str = "default"
    service_name: str = ""
    selector: str = ""
    pod_ip: str = ""
    pod_port: str = ""
    mechanism: str = "endpointslices"
    given: tuple[str, ...] = ()
    """The GUBER_K8S_* variables that were set: Gubernator checks the pool when any is,
    whatever the discovery type."""


@dataclass(frozen=True, slots=True)
class DnsPoolConfig:
    """Gubernator's DNSPoolConfig (GUBER_DNS_FQDN, GUBER_RESOLV_CONF)."""

    fqdn: str = ""
    resolv_conf: str = "/etc/resolv.conf"


@dataclass(frozen=True, slots=True)
class MemberListPoolConfig:
    """Gubernator's MemberListPoolConfig (GUBER_MEMBERLIST_*)."""

    address: str = ""
    """Where other members reach our gossip (host:port); "" = the advertised host, 7946."""
    bind_address: str = ""
    """Where the gossip listens; "" = all interfaces, the port of ``address``."""
    advertise_address: str = ""
    """The gRPC address our metadata names; "" = the node's advertised one."""
    known_nodes: tuple[str, ...] = ()
    node_name: str = ""
    """"" = the host name, as Gubernator (memberlist) names a node."""
    secret_keys: tuple[str, ...] = field(default=(), repr=False)
    gossip_verify_incoming: bool = True
    gossip_verify_outgoing: bool = True


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    grpc_address: str = "127.0.0.1:1051"
    http_address: str = "127.0.0.1:1050"
    status_http_address: str = ""
    """With TLS: another HTTPS listener serving only /v1/HealthCheck, asking no client
    certificate (Gubernator's GUBER_STATUS_HTTP_ADDRESS)."""
    advertise_address: str = ""
    """The gRPC address peers use for this node; defaults to ``grpc_address``."""
    peer_address: str = ""
    """Where PeersV1 (node-to-node) is served; defaults to the gRPC host and port + 1.
    Other nodes are called where their discovery record says (``advertise_peer``), else
    at their gRPC port + 1 (``peer_address_of``)."""
    peers_on_grpc_port: bool = False
    """Serve PeersV1 on the gRPC port and call peers there, as Gubernator does: needed in a
    cluster that mixes Gubernator and smockron nodes. Any client of the gRPC port can then
    call PeersV1 (forge GLOBAL state), unless TLS client certificates keep them out."""
    peer_check_address: bool = True
    """PeersV1 calls are taken only from the address of another member of the peer
    list (smockron/cluster/peergate.py); off for members that call from an address
    their record does not name (NAT, a second interface)."""
    peer_tls_names: str = ""
    """Comma-separated names (DNS or IP SANs), of which a peer's client certificate must
    carry one for PeersV1 (TLS with require-and-verify): the cluster's CA may sign
    certificates for clients too."""
    peer_discovery: str = "static"
    """static (``peers``, else this node alone), etcd, dns, k8s or member-list; the
    mechanisms' own settings are the pools below, as in Gubernator's DaemonConfig."""
    peers: tuple[str, ...] = ()
    peers_file: str = ""
    """Static peers read from this file (one ``--peers`` entry a line), re-read on SIGHUP and
    when it changes."""
    etcd: EtcdPoolConfig = field(default_factory=lambda: EtcdPoolConfig())
    k8s: K8sPoolConfig = field(default_factory=lambda: K8sPoolConfig())
    dns: DnsPoolConfig = field(default_factory=lambda: DnsPoolConfig())
    member_list: MemberListPoolConfig = field(default_factory=lambda: MemberListPoolConfig())
    data_center: str = ""
    batch_wait_ms: float = 0.5
    batch_limit: int = 1000
    batch_timeout_ms: float = 500.0
    global_sync_wait_ms: float = 100.0
    global_batch_limit: int = 1000
    global_timeout_ms: float = 500.0
    global_mode: str = "lend"
    """How non-owners spend a GLOBAL limit: ``lend`` (default) admits only the budget the
    owner lends each node, so the cluster never spends the same remaining twice;
    ``gubernator`` behaves as Gubernator does (a fresh local bucket for a key a node has
    not heard of, then the whole remaining it last heard of), for exact drop-in answers at
    the price of Gubernator's over-admission (up to the remaining times the nodes)."""
    cache_size: int = 50_000
    peer_down_after: int = 3
    """Consecutive failed calls after which a peer leaves the ring until it answers again."""
    peer_probe_interval_ms: float = 1000.0
    reclaim_interval_ms: float = 1000.0
    """How often expired keys are swept out of the cache (LocalLimiter.reclaim)."""
    log_level: str = ""
    """GUBER_LOG_LEVEL / GUBER_DEBUG as a logging level name; "" = smockron's own."""
    log_format: str = ""
    """GUBER_LOG_FORMAT (text, json); "" = smockron's own."""
    ignored: tuple[str, ...] = ()
    """One line for each GUBER_* variable that is set and has no effect here, logged at
    start."""
    graceful_termination_delay_ms: float = 0.0
    """On SIGTERM, keep serving this long before stopping (GUBER_GRACEFUL_TERMINATION_DELAY_SEC),
    so a load balancer stops sending here first."""
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
    # TLS, as Gubernator's GUBER_TLS_* (smockron/cluster/tls.py; docs/cluster.md, TLS)
    tls_ca: str = ""
    tls_ca_key: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_auto: bool = False
    tls_client_auth: str = ""
    tls_client_auth_ca_cert: str = ""
    tls_client_auth_cert: str = ""
    tls_client_auth_key: str = ""
    tls_client_auth_server_name: str = ""
    tls_insecure_skip_verify: bool = False
    tls_min_version: str = "1.3"
    """Least TLS version of the HTTP gateway: 1.0, 1.1, 1.2 or 1.3 (Gubernator's default)."""
    tls_client_san: str = ""
    """envoyproxy/ratelimit's GRPC_CLIENT_TLS_SAN: a name (DNS or IP) that verified client
    certificates must carry to call the gRPC port (smockron/cluster/san.py)."""

    @property
    def tls(self) -> bool:
        """Are the gRPC port, the HTTP gateway and peer calls on TLS?"""
        return bool(self.tls_auto or self.tls_cert or self.tls_key)

    @property
    def advertise(self) -> str:
        return self.advertise_address or self.grpc_address

    @property
    def peer_listen_address(self) -> str:
        """This node's PeersV1 listener ("" when PeersV1 is on the gRPC port)."""
        if self.peers_on_grpc_port:
            return ""
        return self.peer_address or peer_address_of(self.grpc_address)

    @property
    def advertise_peer(self) -> str:
        """Where other nodes reach this node's PeersV1, for discovery records to carry:
        the listener's port on the advertised host (the listener's own host when it names
        one). "" when not known before binding (port 0)."""
        if self.peers_on_grpc_port:
            return self.advertise
        if not self.peer_address:
            return peer_address_of(self.advertise)
        host, _, port = self.peer_address.rpartition(":")
        if not port.isdigit() or int(port) == 0:
            return ""
        if host in WILDCARD_HOSTS:
            host = self.advertise.rpartition(":")[0]
        return f"{host}:{port}"

    def validate(self) -> ClusterConfig:
        _one_of("grpc_server", self.grpc_server, GRPC_SERVERS)
        _one_of("global_mode", self.global_mode, GLOBAL_MODES)
        _one_of("peer_picker_hash", self.peer_picker_hash, HASHES)
        self._validate_bounds()
        if self.peers_on_grpc_port and self.peer_address:
            raise ConfigError(
                "peer_address and peers_on_grpc_port exclude each other: "
                "PeersV1 is served on one of the two"
            )
        listen = self.peer_listen_address
        if listen and listen == self.grpc_address and not listen.endswith(":0"):
            raise ConfigError(
                f"peer_address must differ from the gRPC address {self.grpc_address!r}"
            )
        self._validate_tls()
        self._validate_discovery()
        return self

    def _validate_bounds(self) -> None:
        names = ("batch_limit", "global_batch_limit", "cache_size", "peer_down_after")
        for name in (*names, "peer_picker_replicas"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("batch_limit", "global_batch_limit"):
            if getattr(self, name) > MAX_BATCH:  # a peer refuses larger calls
                raise ConfigError(f"{name} must be <= {MAX_BATCH}, got {getattr(self, name)!r}")
        for name in ("batch_wait_ms", "global_sync_wait_ms", "envoy_reload_interval_ms"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("batch_timeout_ms", "global_timeout_ms"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)!r}")

    def _validate_discovery(self) -> None:
        _one_of("peer_discovery", self.peer_discovery, DISCOVERY_TYPES)
        if self.peers and self.peer_discovery not in ("static", "none"):
            raise ConfigError(
                f"a static peer list (--peers, GUBER_PEERS) and "
                f"{self.peer_discovery} discovery exclude each other"
            )
        if self.member_list.secret_keys:  # their format, before anything starts
            from smockron.cluster.discovery.memberlist_wire import secret_keys

            try:
                secret_keys(self.member_list.secret_keys)
            except ValueError as exc:
                raise ConfigError(f"GUBER_MEMBERLIST_SECRET_KEYS: {exc}") from None
        if self.k8s.mechanism not in K8S_MECHANISMS:
            raise ConfigError(k8s_mechanism_error(self.k8s.mechanism))
        if self.k8s.given and not (self.k8s.service_name or self.k8s.selector):
            raise ConfigError(
                f"{self.k8s.given[0]} is set: when using k8s for peer discovery with "
                "endpointslices, you MUST provide `GUBER_K8S_SERVICE_NAME` to identify the "
                "Service (or GUBER_K8S_SELECTOR)"
            )

    def _validate_tls(self) -> None:
        _one_of("tls_client_auth", self.tls_client_auth, CLIENT_AUTH_MODES, CLIENT_AUTH_MODES[1:])
        _one_of("tls_min_version", self.tls_min_version, TLS_VERSIONS)
        if not self.tls_auto and bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError(
                "TLS needs both a certificate (GUBER_TLS_CERT) and its key "
                "(GUBER_TLS_KEY), or GUBER_TLS_AUTO"
            )
        if self.tls_ca_key and not self.tls_ca:
            raise ConfigError("GUBER_TLS_CA_KEY needs the CA certificate (GUBER_TLS_CA)")
        needs_tls = (self.tls_ca, self.tls_client_auth, self.tls_client_auth_ca_cert)
        if not self.tls and any((*needs_tls, self.tls_client_san)):
            raise ConfigError(
                "TLS settings given but no server certificate: set GUBER_TLS_CERT "
                "and GUBER_TLS_KEY, or GUBER_TLS_AUTO=true"
            )
        if self.tls_client_auth and not (self.tls_client_auth_ca_cert or self.tls_ca):
            raise ConfigError(
                "client auth enabled, but no CA's provided "
                "(GUBER_TLS_CLIENT_AUTH_CA_CERT or GUBER_TLS_CA)"
            )


def peer_address_of(grpc_address: str) -> str:
    """A node's PeersV1 address: its gRPC host, port + 1 (port 0, "any", stays 0)."""
    host, sep, port = grpc_address.rpartition(":")
    if not sep or not port.isdigit():
        return grpc_address
    number = int(port)
    return f"{host}:{number + 1 if number else 0}"


def _one_of(
    name: str, value: object, choices: Collection[str], shown: Collection[str] | None = None
) -> None:
    """The one wording of a setting outside its choices (``shown``: the ones to name)."""
    if value not in choices:
        known = ", ".join(choices if shown is None else shown)
        raise ConfigError(f"{name} must be one of {known}, got {value!r}")


POOLS = ("etcd", "k8s", "dns", "member_list")


def with_changes(config: ClusterConfig, changes: Mapping[str, Any]) -> ClusterConfig:
    """``config`` with ``changes``, whose keys are fields or ``pool.field``."""
    top = {k: v for k, v in changes.items() if "." not in k}
    for pool in POOLS:
        nested = {k.partition(".")[2]: v for k, v in changes.items() if k.startswith(pool + ".")}
        if nested:
            top[pool] = replace(getattr(config, pool), **nested)
    return replace(config, **top)


FIELD_NAMES = frozenset(f.name for f in fields(ClusterConfig))
