"""The discovery contract shared by every mechanism."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from smockron.registry import Registry


@dataclass(frozen=True, slots=True, order=True)
class PeerInfo:
    """One node: its gRPC address (``host:port``), optionally its HTTP address, and
    where it serves PeersV1 when the record says so.

    ``peer_address`` empty means the record did not carry it (Gubernator's records, DNS):
    the caller then dials the gRPC port + 1, or the gRPC port with ``peers_on_grpc_port``.
    """

    grpc_address: str
    http_address: str = ""
    data_center: str = ""
    peer_address: str = ""


OnChange = Callable[[list[PeerInfo]], None]
"""Called with the complete, current peer list (the local node included) on every change."""


class Discovery(Protocol):
    async def start(self, on_change: OnChange) -> None:
        """Begin discovery; call ``on_change`` at least once with the initial list."""

    async def stop(self) -> None:
        """Stop watching and withdraw this node's registration, if any."""


_MODULE = "smockron.cluster.discovery."
DISCOVERY: Registry[Discovery] = Registry(
    "peer discovery",
    {
        "static": _MODULE + "static",
        "file": _MODULE + "static",
        "etcd": _MODULE + "etcd",
        "dns": _MODULE + "dns",
        "kubernetes": _MODULE + "kubernetes",
        "k8s": _MODULE + "kubernetes",
        "member-list": _MODULE + "memberlist",
    },
)
"""Kind -> the Discovery class serving it, each module imported on first use."""
