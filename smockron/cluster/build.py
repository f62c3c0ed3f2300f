"""The node's settings, built once: flags, ``GUBER_*`` and a ``--config`` file folded
into one ClusterConfig (smockron.cluster.config), and the discovery it names. Pure but
for the host's own address (a wildcard gRPC address advertises it); ``smockron cluster``
(smockron.cluster.cli) calls these."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from prometheus_client import CollectorRegistry

from smockron.cluster.config import ClusterConfig, with_changes
from smockron.cluster.discovery import make_discovery, options
from smockron.cluster.discovery.base import Discovery, PeerInfo
from smockron.cluster.guber_env import from_env
from smockron.errors import ConfigError
from smockron.settings import WILDCARD_HOSTS, parse_host_port

# flag (click parameter name) -> the discovery pool field it sets
_DISCOVERY_FLAGS = {
    "etcd_endpoints": "etcd.endpoints",
    "dns_fqdn": "dns.fqdn",
    "k8s_namespace": "k8s.namespace",
    "k8s_selector": "k8s.selector",
    "k8s_pod_ip": "k8s.pod_ip",
}


FIELDS = frozenset(f.name for f in fields(ClusterConfig))


def _changes(values: Mapping[str, Any]) -> dict[str, Any]:
    """Flag values (click's, already converted) as ClusterConfig changes (with_changes)."""
    changes = {k: v for k, v in values.items() if v is not None and k in FIELDS}
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
    return replace(config, **listen_everywhere(config)).validate()


def listen_everywhere(config: ClusterConfig) -> dict[str, Any]:
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
            raise ConfigError(
                f"peers_file is a static peer list: it excludes --peers and --peer-discovery {kind}"
            )
        return make_discovery("file", path=config.peers_file, advertise=me)
    found = options(config, me)
    if found is None:
        return make_discovery("static", peers=list(config.peers) or [me.grpc_address], advertise=me)
    return make_discovery(found[0], **found[1], registry=registry)


def printable(config: ClusterConfig) -> dict[str, Any]:
    """The settings for --print-settings, secrets masked."""
    values = {f: getattr(config, f) for f in sorted(FIELDS)}
    if config.etcd.password:
        values["etcd"] = replace(config.etcd, password="***")
    if config.member_list.secret_keys:
        values["member_list"] = replace(config.member_list, secret_keys=("***",))
    return values
