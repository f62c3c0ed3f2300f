"""Pieces every discovery mechanism shares: normalising peer lists, change detection,
and the counters for hostile input.

Kept apart from ``base.py`` (the contract other helpers import) so mechanisms can grow
helpers without touching the contract.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Iterable

from prometheus_client import Counter

from smockron.cluster.discovery.base import OnChange, PeerInfo

log = logging.getLogger("smockron.cluster.discovery")

MALFORMED = Counter(
    "smockron_discovery_malformed_total",
    "Peer records rejected because they could not be parsed.",
    ["mechanism"],
)
ERRORS = Counter(
    "smockron_discovery_errors_total",
    "Failed discovery rounds (backend unreachable, timed out, answered an error).",
    ["mechanism"],
)


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
    """Parse ``host:port`` / ``[v6]:port``; a clear ValueError names a bad address."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"peer address {address!r} is not host:port")
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError(f"peer address {address!r} has port out of range")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def as_peer(value: PeerInfo | str) -> PeerInfo:
    """Accept either a PeerInfo or a bare gRPC address."""
    if isinstance(value, PeerInfo):
        return value
    split_host_port(value)
    return PeerInfo(grpc_address=value)


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
