"""A fixed peer list, e.g. ``--peers 127.0.0.1:1051,127.0.0.1:1052``.

The list holds the gRPC address of every node, this one included; if the local node is
missing it is added, so a node can always route to itself.
"""

from __future__ import annotations

from collections.abc import Iterable

from smockron.cluster.discovery._common import Publisher, as_peer
from smockron.cluster.discovery.base import OnChange, PeerInfo


def parse_peers(text: str) -> list[PeerInfo]:
    """``"a:1051, b:1051"`` -> PeerInfo list; raises ValueError naming a bad entry."""
    return [as_peer(item.strip()) for item in text.split(",") if item.strip()]


class StaticDiscovery:
    """Reports one list at start and never changes it."""

    def __init__(
        self, peers: Iterable[PeerInfo | str] | str, advertise: PeerInfo | str | None = None
    ) -> None:
        items = parse_peers(peers) if isinstance(peers, str) else [as_peer(p) for p in peers]
        self._peers = items
        self._me = as_peer(advertise) if advertise is not None else None
        if not items and self._me is None:
            raise ValueError("static discovery needs at least one peer address")
        self._publisher: Publisher | None = None

    async def start(self, on_change: OnChange) -> None:
        self._publisher = Publisher(on_change, self._me)
        self._publisher.publish(self._peers)

    async def stop(self) -> None:
        self._publisher = None
