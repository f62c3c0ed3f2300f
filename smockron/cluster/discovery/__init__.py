"""Peer discovery: each mechanism reports the full peer list whenever it changes.

Mechanisms live one per module (``static``, ``etcd``, ``dns``, ``kubernetes``,
``memberlist``); each class declares the kinds it serves and registers in
:data:`~smockron.cluster.discovery.base.DISCOVERY` (``smockron.registry``), which
:func:`make_discovery` asks, so a node using a static list never imports an etcd or
Kubernetes client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from smockron import errors
from smockron.cluster import config as _config
from smockron.cluster.config import peer_address_of as _peer_address_of
from smockron.cluster.discovery.base import DISCOVERY as _DISCOVERY
from smockron.cluster.discovery.base import Discovery, OnChange, PeerInfo

MECHANISMS: Mapping[str, str] = _DISCOVERY.modules
"""Kind -> the module of the class that serves it; ``k8s`` is Gubernator's
GUBER_PEER_DISCOVERY_TYPE spelling of ``kubernetes``."""

__all__ = [
    "MECHANISMS",
    "Discovery",
    "OnChange",
    "PeerInfo",
    "make_discovery",
    "options",
    "options_from_env",
]


def make_discovery(kind: str, **options: Any) -> Discovery:
    """Build the mechanism named ``kind`` with its constructor's keyword ``options``."""
    cls = _DISCOVERY.lookup(kind.lower())
    try:
        discovery: Discovery = cls(**options)
    except (TypeError, ValueError) as exc:
        raise errors.ConfigError(f"bad options for {kind} discovery: {exc}") from exc
    return discovery


def options_from_env(
    environ: Mapping[str, str], advertise: PeerInfo
) -> tuple[str, dict[str, Any]] | None:
    """Gubernator's ``GUBER_*`` discovery variables -> ``(kind, options)`` for make_discovery;
    None for a static list or ``none``. See :func:`options`."""
    from smockron.cluster.guber_env import from_env

    return options(from_env(environ), advertise)


def options(
    config: _config.ClusterConfig, advertise: PeerInfo
) -> tuple[str, dict[str, Any]] | None:
    """The mechanism ``config.peer_discovery`` names, with its pool's settings, as
    ``(kind, options)`` for make_discovery; None for a static list or ``none``."""
    kind = config.peer_discovery
    if kind in ("static", "none"):
        return None
    if kind == "etcd":
        return "etcd", _etcd(config.etcd, advertise)
    if kind == "dns":
        if not config.dns.fqdn:
            raise errors.ConfigError("GUBER_DNS_FQDN must be set for dns peer discovery")
        return "dns", {
            "fqdn": config.dns.fqdn,
            "advertise": advertise,
            "resolv_conf": config.dns.resolv_conf,
        }
    if kind == "k8s":
        return "k8s", _k8s(config.k8s)
    return "member-list", _member_list(config.member_list, advertise)


def _etcd(pool: _config.EtcdPoolConfig, advertise: PeerInfo) -> dict[str, Any]:
    grpc_address = pool.advertise_address or advertise.grpc_address
    data_center = advertise.data_center if pool.data_center is None else pool.data_center
    peer_address = _moved_peer_address(advertise, grpc_address)
    options: dict[str, Any] = {
        "advertise": PeerInfo(grpc_address, advertise.http_address, data_center, peer_address),
        "endpoints": ",".join(pool.endpoints),
        "key_prefix": pool.key_prefix,
    }
    options["timeout"] = pool.dial_timeout_ms / 1000
    if pool.username:
        options["username"] = pool.username
        options["password"] = pool.password
    return options


def _moved_peer_address(advertise: PeerInfo, grpc_address: str) -> str:
    """The peer address to advertise under another gRPC address (GUBER_ETCD_ADVERTISE_ADDRESS):
    one that followed the gRPC address (the same, or its port + 1) follows it there; an
    explicit one stays."""
    old = advertise.grpc_address
    if grpc_address == old or advertise.peer_address not in (old, _peer_address_of(old)):
        return advertise.peer_address
    return grpc_address if advertise.peer_address == old else _peer_address_of(grpc_address)


def _k8s(pool: _config.K8sPoolConfig) -> dict[str, Any]:
    """EndpointSlices of GUBER_K8S_SERVICE_NAME (Gubernator's way), else those
    GUBER_K8S_SELECTOR (or the deprecated GUBER_K8S_ENDPOINTS_SELECTOR) selects."""
    port = pool.pod_port or "1051"
    if not port.isdigit():
        raise errors.ConfigError(f"GUBER_K8S_POD_PORT={port!r} is not a port number")
    options: dict[str, Any] = {"namespace": pool.namespace}
    if pool.service_name:
        options["service_name"] = pool.service_name
    elif pool.selector:
        options["selector"] = pool.selector
    else:
        raise errors.ConfigError(
            "k8s peer discovery needs GUBER_K8S_SERVICE_NAME (the "
            "Service whose EndpointSlices list the nodes) or "
            "GUBER_K8S_SELECTOR"
        )
    return {**options, "pod_ip": pool.pod_ip, "pod_port": int(port)}


def _member_list(pool: _config.MemberListPoolConfig, advertise: PeerInfo) -> dict[str, Any]:
    grpc_address = pool.advertise_address or advertise.grpc_address
    me = PeerInfo(
        grpc_address,
        advertise.http_address,
        advertise.data_center,
        _moved_peer_address(advertise, grpc_address),
    )
    host = grpc_address.rpartition(":")[0].strip("[]")
    return {
        "advertise": me,
        "address": pool.address or f"{host}:7946",
        "bind_address": pool.bind_address,
        "known_nodes": list(pool.known_nodes),
        "node_name": pool.node_name,
        **(
            {
                "secret_keys": list(pool.secret_keys),
                "gossip_verify_incoming": pool.gossip_verify_incoming,
                "gossip_verify_outgoing": pool.gossip_verify_outgoing,
            }
            if pool.secret_keys
            else {}
        ),
    }
