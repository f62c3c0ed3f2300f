"""A recorder for discovery callbacks, shared by the discovery tests."""

from __future__ import annotations

import asyncio
import time

from smockron.cluster.discovery.base import PeerInfo


class Recorder:
    """Collects every list ``on_change`` receives; awaits a wanted set of addresses."""

    def __init__(self) -> None:
        self.lists: list[list[PeerInfo]] = []

    def __call__(self, peers: list[PeerInfo]) -> None:
        self.lists.append(peers)

    @property
    def addresses(self) -> set[str]:
        return {p.grpc_address for p in self.lists[-1]} if self.lists else set()

    async def wait_for(self, wanted: set[str], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.addresses != wanted:
            if time.monotonic() > deadline:
                raise AssertionError(f"peers {self.addresses} never became {wanted}")
            await asyncio.sleep(0.02)
