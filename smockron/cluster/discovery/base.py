"""The discovery contract shared by every mechanism."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True, order=True)
class PeerInfo:
    """One node: its gRPC address (``host:port``) and optionally its HTTP address."""

    grpc_address: str
    http_address: str = ""
    data_center: str = ""


OnChange = Callable[[list[PeerInfo]], None]
"""Called with the complete, current peer list (the local node included) on every change."""


class Discovery(Protocol):
    async def start(self, on_change: OnChange) -> None:
        """Begin discovery; call ``on_change`` at least once with the initial list."""

    async def stop(self) -> None:
        """Stop watching and withdraw this node's registration, if any."""
