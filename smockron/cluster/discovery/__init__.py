"""Peer discovery: each mechanism reports the full peer list whenever it changes.

Mechanisms live one per module (``static``, ``etcd``, ``dns``, ``kubernetes``) and are
imported lazily by :func:`make_discovery`, so a node using a static list never imports an
etcd or Kubernetes client.
"""

from __future__ import annotations

import importlib
from typing import Any

from smockron.cluster.discovery.base import Discovery, OnChange, PeerInfo
from smockron.errors import ConfigError

# kind -> "module:class"; "k8s" is Gubernator's GUBER_PEER_DISCOVERY_TYPE spelling.
MECHANISMS: dict[str, str] = {
    "static": "smockron.cluster.discovery.static:StaticDiscovery",
    "etcd": "smockron.cluster.discovery.etcd:EtcdDiscovery",
    "dns": "smockron.cluster.discovery.dns:DnsDiscovery",
    "kubernetes": "smockron.cluster.discovery.kubernetes:KubernetesDiscovery",
    "k8s": "smockron.cluster.discovery.kubernetes:KubernetesDiscovery",
}

__all__ = ["MECHANISMS", "Discovery", "OnChange", "PeerInfo", "make_discovery"]


def make_discovery(kind: str, **options: Any) -> Discovery:
    """Build the mechanism named ``kind`` with its constructor's keyword ``options``."""
    target = MECHANISMS.get(kind.lower())
    if target is None:
        choices = ", ".join(sorted(MECHANISMS))
        raise ConfigError(f"unknown peer discovery {kind!r}; choices are {choices}")
    module_name, cls_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    try:
        discovery: Discovery = cls(**options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"bad options for {kind} discovery: {exc}") from exc
    return discovery
