"""Pieces every discovery mechanism shares: normalising peer lists, change detection,
parsing addresses, and the counters for hostile input.

Kept apart from ``base.py`` (the contract other helpers import) so mechanisms can grow
helpers without touching the contract.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter

from smockron.cluster.discovery.base import OnChange, PeerInfo
from smockron.errors import ConfigError
from smockron.settings import parse_host_port

log = logging.getLogger("smockron.cluster.discovery")


class DiscoveryMetrics:
    """One mechanism's counters, labelled with its name, on ``registry`` (the node's, so
    its ``/metrics`` shows them; a fresh one by default). Per instance, so two nodes in
    one process count apart."""

    def __init__(self, mechanism: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        malformed = Counter(
            "smockron_discovery_malformed_total",
            "Peer records rejected because they could not be parsed.",
            ["mechanism"],
            registry=self.registry,
        )
        errors = Counter(
            "smockron_discovery_errors_total",
            "Failed discovery rounds (backend unreachable, timed out, answered an error).",
            ["mechanism"],
            registry=self.registry,
        )
        self.malformed = malformed.labels(mechanism)
        self.errors = errors.labels(mechanism)


def normalize(peers: Iterable[PeerInfo], me: PeerInfo | None = None) -> list[PeerInfo]:
    """A sorted list with one entry per gRPC address, always including ``me``.

    The local node is added even when the backend does not list it yet (not ready, DNS
    not propagated), because the ring must always be able to route to ourselves.
    """
    by_address: dict[str, PeerInfo] = {}
    for peer in peers:
        by_address.setdefault(peer.grpc_address, peer)
    if me is not None:
        by_address[me.grpc_address] = me
    return sorted(by_address.values())


def join_host_port(host: str, port: int) -> str:
    """``host:port``, with IPv6 literals bracketed as gRPC expects."""
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    except ValueError:
        pass
    return f"{host}:{port}"


def split_host_port(address: str) -> tuple[str, int]:
    """A peer's ``host:port`` / ``[v6]:port`` by smockron's one parser
    (settings.parse_host_port: a host, a port in 1..65535, IPv6 in brackets); a bad one
    raises ValueError naming it, so that a discovery record is skipped, not fatal."""
    try:
        return parse_host_port(address)
    except ConfigError as exc:
        raise ValueError(f"peer address {address!r}: {exc}") from None


def as_peer(value: PeerInfo | str) -> PeerInfo:
    """Accept either a PeerInfo or a static entry (see :func:`parse_peer`)."""
    if isinstance(value, PeerInfo):
        return value
    return parse_peer(value)


def parse_peer(text: str) -> PeerInfo:
    """``GRPC`` or ``GRPC/PEER``: a gRPC address, optionally followed by where the node
    serves PeersV1, as ``host:port`` or a bare port on the gRPC host.

    ``10.0.0.1:1051/7000`` is ``10.0.0.1:1051`` with PeersV1 at ``10.0.0.1:7000``.
    """
    grpc_address, sep, peer = text.strip().partition("/")
    host, _ = split_host_port(grpc_address)
    if not sep:
        return PeerInfo(grpc_address=grpc_address)
    if peer.isdigit():
        peer = join_host_port(host, int(peer))
    split_host_port(peer)
    return PeerInfo(grpc_address=grpc_address, peer_address=peer)


class Publisher:
    """Calls ``on_change`` with the normalised list, but only when it differs from the last."""

    def __init__(self, on_change: OnChange, me: PeerInfo | None) -> None:
        self._on_change = on_change
        self._me = me
        self.current: list[PeerInfo] | None = None
        self.calls = 0

    def publish(self, peers: Iterable[PeerInfo]) -> bool:
        """Report ``peers``; returns True if the list changed and was delivered."""
        new = normalize(peers, self._me)
        if new == self.current:
            return False
        self.current = new
        self.calls += 1
        try:
            self._on_change(list(new))
        except Exception:
            log.exception("discovery on_change callback failed")
        return True


async def cancel_task(task: asyncio.Task[None] | None) -> None:
    """Cancel a mechanism's background task and wait until it has really finished, so
    ``stop()`` returns with no watch or poll left running."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
