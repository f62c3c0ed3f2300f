"""Peer discovery: each mechanism reports the full peer list whenever it changes.

Mechanisms live one per module (``static``, ``etcd``, ``dns``, ``kubernetes``) and are
imported lazily by :func:`make_discovery`, so a node using a static list never imports an
etcd or Kubernetes client.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from smockron import errors
from smockron.cluster.config import peer_address_of as _peer_address_of
from smockron.cluster.discovery.base import Discovery, OnChange, PeerInfo

# kind -> "module:class"; "k8s" is Gubernator's GUBER_PEER_DISCOVERY_TYPE spelling.
MECHANISMS: dict[str, str] = {
    "static": "smockron.cluster.discovery.static:StaticDiscovery",
    "file": "smockron.cluster.discovery.static:FileDiscovery",
    "etcd": "smockron.cluster.discovery.etcd:EtcdDiscovery",
    "dns": "smockron.cluster.discovery.dns:DnsDiscovery",
    "kubernetes": "smockron.cluster.discovery.kubernetes:KubernetesDiscovery",
    "k8s": "smockron.cluster.discovery.kubernetes:KubernetesDiscovery",
}

__all__ = [
    "MECHANISMS",
    "Discovery",
    "OnChange",
    "PeerInfo",
    "make_discovery",
    "options_from_env",
]


def make_discovery(kind: str, **options: Any) -> Discovery:
    """Build the mechanism named ``kind`` with its constructor's keyword ``options``."""
    target = MECHANISMS.get(kind.lower())
    if target is None:
        choices = ", ".join(sorted(MECHANISMS))
        raise errors.ConfigError(f"unknown peer discovery {kind!r}; choices are {choices}")
    module_name, cls_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    try:
        discovery: Discovery = cls(**options)
    except (TypeError, ValueError) as exc:
        raise errors.ConfigError(f"bad options for {kind} discovery: {exc}") from exc
    return discovery


def options_from_env(
    environ: Mapping[str, str], advertise: PeerInfo
) -> tuple[str, dict[str, Any]] | None:
    """Gubernator's ``GUBER_*`` discovery variables -> ``(kind, options)`` for make_discovery.

    None when ``GUBER_PEER_DISCOVERY_TYPE`` is unset or ``none``; ``member-list`` (gossip,
    which smockron does not implement) is a ConfigError naming the alternatives.
    """
    kind = environ.get("GUBER_PEER_DISCOVERY_TYPE", "").strip().lower()
    if kind in ("", "none"):
        return None
    if kind == "etcd":
        return "etcd", _etcd_env(environ, advertise)
    if kind == "dns":
        return "dns", {
            "fqdn": _required(environ, "GUBER_DNS_FQDN"),
            "advertise": advertise,
            "resolv_conf": environ.get("GUBER_RESOLV_CONF", "/etc/resolv.conf"),
        }
    if kind == "k8s":
        return "k8s", _k8s_env(environ)
    choices = "etcd, dns, k8s, none (or smockron's --peers static list)"
    raise errors.ConfigError(
        f"GUBER_PEER_DISCOVERY_TYPE={kind!r} is not supported; choices are {choices}"
    )


def _required(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "").strip()
    if not value:
        raise errors.ConfigError(f"{name} must be set for this peer discovery type")
    return value


def _etcd_env(environ: Mapping[str, str], advertise: PeerInfo) -> dict[str, Any]:
    grpc_address = environ.get("GUBER_ETCD_ADVERTISE_ADDRESS") or advertise.grpc_address
    data_center = environ.get("GUBER_ETCD_DATA_CENTER", advertise.data_center)
    peer_address = _moved_peer_address(advertise, grpc_address)
    options: dict[str, Any] = {
        "advertise": PeerInfo(grpc_address, advertise.http_address, data_center, peer_address),
        "endpoints": environ.get("GUBER_ETCD_ENDPOINTS", "localhost:2379"),
        "key_prefix": environ.get("GUBER_ETCD_KEY_PREFIX", "/gubernator-peers"),
    }
    if environ.get("GUBER_ETCD_USER"):
        options["username"] = environ["GUBER_ETCD_USER"]
        options["password"] = environ.get("GUBER_ETCD_PASSWORD", "")
    return options


def _moved_peer_address(advertise: PeerInfo, grpc_address: str) -> str:
    """The peer address to advertise under another gRPC address (GUBER_ETCD_ADVERTISE_ADDRESS):
    one that followed the gRPC address (the same, or its port + 1) follows it there; an
    explicit one stays."""
    old = advertise.grpc_address
    if grpc_address == old or advertise.peer_address not in (old, _peer_address_of(old)):
        return advertise.peer_address
    return grpc_address if advertise.peer_address == old else _peer_address_of(grpc_address)


def _k8s_env(environ: Mapping[str, str]) -> dict[str, Any]:
    mechanism = environ.get("GUBER_K8S_WATCH_MECHANISM", "endpointslices").lower()
    if mechanism not in ("", "endpoints", "endpointslices"):
        raise errors.ConfigError(
            f"GUBER_K8S_WATCH_MECHANISM={mechanism!r}: only endpointslices is supported"
        )
    port = environ.get("GUBER_K8S_POD_PORT", "1051")
    if not port.isdigit():
        raise errors.ConfigError(f"GUBER_K8S_POD_PORT={port!r} is not a port number")
    return {
        "namespace": environ.get("GUBER_K8S_NAMESPACE", "default"),
        "selector": _required(environ, "GUBER_K8S_ENDPOINTS_SELECTOR"),
        "pod_ip": environ.get("GUBER_K8S_POD_IP", ""),
        "pod_port": int(port),
    }
