"""A fixed peer list, e.g. ``--peers 127.0.0.1:1051,127.0.0.1:1061``, or one read from a
file (``--peers-file``) and re-read when it changes.

The list holds the gRPC address of every node, this one included; if the local node is
missing it is added, so a node can always route to itself. An entry may name where its
node serves PeersV1 after a slash (``10.0.0.1:1051/10.0.0.1:7000``, or ``10.0.0.1:1051/7000``
on the same host); without one, peers are called at the gRPC port + 1 (or at the gRPC port
with ``peers_on_grpc_port``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable

from smockron.cluster.discovery._common import Publisher, as_peer, cancel_task
from smockron.cluster.discovery.base import DISCOVERY, OnChange, PeerInfo
from smockron.ratelog import RateLimitedLog

log = logging.getLogger("smockron.cluster.discovery")
_log = RateLimitedLog(log, interval=10.0)


def parse_peers(text: str) -> list[PeerInfo]:
    """``"a:1051, b:1051/7000"`` -> PeerInfo list; raises ValueError naming a bad entry."""
    return [as_peer(item.strip()) for item in text.split(",") if item.strip()]


@DISCOVERY.register
class StaticDiscovery:
    """Reports one list at start and never changes it."""

    schemes = ("static",)

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


def read_peers_file(path: str) -> list[PeerInfo]:
    """One entry a line, as in ``--peers`` (commas also separate); blank lines and ``#``
    comments are skipped. Raises OSError (unreadable) or ValueError naming a bad entry."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    items: list[PeerInfo] = []
    for line in text.splitlines():
        items.extend(parse_peers(line.split("#", 1)[0]))
    return items


@DISCOVERY.register
class FileDiscovery:
    """Static peers from a file, re-read when it changes (checked every ``interval``
    seconds) and on ``reload`` (SIGHUP), so nodes can be added and removed without a
    restart. A file that cannot be read or parsed keeps the current list (logged)."""

    schemes = ("file",)

    def __init__(
        self, path: str, advertise: PeerInfo | str | None = None, interval: float = 1.0
    ) -> None:
        self.path = path
        self.interval = interval
        self._me = as_peer(advertise) if advertise is not None else None
        self._publisher: Publisher | None = None
        self._stamp: tuple[int, int, int] | None = None
        self._task: asyncio.Task[None] | None = None
        self.peers = read_peers_file(path)  # a bad file stops the command at start
        if not self.peers and self._me is None:
            raise ValueError(f"{path}: no peer addresses")

    async def start(self, on_change: OnChange) -> None:
        self._publisher = Publisher(on_change, self._me)
        self._stamp = self._file_stamp()
        self._publisher.publish(self.peers)
        if self.interval > 0:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        await cancel_task(self._task)
        self._task = None
        self._publisher = None

    def reload(self) -> bool:
        """Read the file now; True when the peer list changed."""
        self._stamp = self._file_stamp()
        try:
            peers = read_peers_file(self.path)
        except (OSError, ValueError) as exc:
            _log.warning("peers file %s: keeping the current peers: %s", self.path, exc)
            return False
        self.peers = peers
        changed = self._publisher is not None and self._publisher.publish(peers)
        log.info(
            "peers file %s read: %d peers%s",
            self.path,
            len(peers),
            "" if changed else " (unchanged)",
        )
        return changed

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if self._file_stamp() != self._stamp:
                self.reload()
