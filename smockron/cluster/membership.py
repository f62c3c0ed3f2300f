"""A node's view of its peers: the ring over the peers discovery lists, a PeersV1 client
per peer, and the peers routed around while they fail (``peer_down_after`` failures in a
row), probed with LiveCheck until they answer again. ``Node`` (smockron.cluster.node) is
built on it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Iterable

from smockron.cluster.config import ClusterConfig, peer_address_of
from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.metrics import ClusterMetrics
from smockron.cluster.peers import PeerClient
from smockron.cluster.tls import TLSMaterial
from smockron.core.hashring import HashRing
from smockron.ratelog import escaped

log = logging.getLogger("smockron.cluster.node")


class Membership:
    """The peers part of ``Node``; its state is set up by ``Node.__init__``."""

    config: ClusterConfig
    metrics: ClusterMetrics
    tls: TLSMaterial | None
    address: str
    ring: HashRing
    peer_infos: dict[str, PeerInfo]
    in_peer_list: bool
    clients: dict[str, PeerClient]
    down: set[str]
    _probe_task: asyncio.Task[None] | None
    _closing: list[PeerClient]
    _tasks: set[asyncio.Task[None]]
    _delayed: set[asyncio.Task[None]]

    def count(self, route: str, checks: int) -> None:
        """Count ``checks`` decided by ``route`` (``Node.count``)."""
        raise NotImplementedError

    def count_relayed(self, clients: Iterable[PeerClient] | None = None) -> None:
        """Count the checks relayed to their owners from gRPC threads (``api.forward_now``)
        that the owners have answered since the last call, of ``clients`` (default: every
        peer's): done where the counters are read (``/metrics``), and before and after a
        removed peer's client is closed (its close waits for the relays in flight)."""
        for client in self.clients.values() if clients is None else clients:
            relayed = client.relayed()
            if relayed:
                self.count("forwarded", relayed)

    def set_peers(self, peers: Iterable[PeerInfo]) -> None:
        """Discovery's callback: the full list, this node included (added if missing)."""
        infos = {p.grpc_address: p for p in peers}
        self.in_peer_list = self.address in infos
        infos.setdefault(self.address, PeerInfo(self.address))
        self.peer_infos = infos
        for addr, client in list(self.clients.items()):
            # gone, or its record now names another PeersV1 address: a new client
            if addr not in infos or client.target != self._peer_target(addr):
                self._closing.append(self.clients.pop(addr))
                self.down.discard(addr)
        for addr in infos:
            if addr != self.address and addr not in self.clients:
                self.clients[addr] = self._new_client(addr)
        self._rebuild_ring()
        if self._closing:
            with contextlib.suppress(RuntimeError):  # no loop yet: closed in close()
                task = asyncio.get_running_loop().create_task(self._close_removed())
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        log.info("peers: %s (ring: %s)", sorted(infos), list(self.ring.nodes))

    def _new_client(self, address: str) -> PeerClient:
        return PeerClient(
            address,
            batch_wait_ms=self.config.batch_wait_ms,
            batch_limit=self.config.batch_limit,
            timeout_ms=self.config.batch_timeout_ms,
            tls=self.tls,
            target=self._peer_target(address),
        )

    def _peer_target(self, address: str) -> str:
        """Where a peer serves PeersV1: what its discovery record says, else its gRPC
        port (``peers_on_grpc_port``, as Gubernator) or that port + 1."""
        info = self.peer_infos.get(address)
        if info is not None and info.peer_address:
            return info.peer_address
        return address if self.config.peers_on_grpc_port else peer_address_of(address)

    def use_tls(self, tls: TLSMaterial) -> None:
        """New certificates (a reload): every peer gets a new channel that shows them; the
        old clients finish their calls and close. The dict is swapped whole, as gRPC
        worker threads read it (``answer_here``)."""
        self.tls = tls
        old = self.clients
        self.clients = {addr: self._new_client(addr) for addr in old}
        self._closing.extend(old.values())
        # calls in progress on the old channels have until their deadline to finish
        task = asyncio.get_running_loop().create_task(
            self._close_removed(after=self._call_deadline())
        )
        self._delayed.add(task)
        task.add_done_callback(self._delayed.discard)

    def _rebuild_ring(self) -> None:
        self.ring.set_nodes(a for a in self.peer_infos if a not in self.down)

    async def _close_removed(self, after: float = 0.0) -> None:
        if after:
            await asyncio.sleep(after)
        closing, self._closing = self._closing, []
        self.count_relayed(closing)  # their relays answered so far: seen by /metrics now
        for client in closing:
            await client.close()  # waits for the relays still in flight
        self.count_relayed(closing)  # and those answered while it waited
        if not closing:
            return
        # A failed call leaves reference cycles (exception, traceback, frames) that hold
        # its channel's core, which keeps reconnecting to the removed peer (probing it, in
        # effect) until a collection: collect now. Rare (membership changes, certificate
        # reloads); ~65 ms with a million keys cached.
        del closing, client
        gc.collect()

    def _call_deadline(self) -> float:
        """The longest a call to a peer may last (seconds)."""
        return max(self.config.batch_timeout_ms, self.config.global_timeout_ms) / 1000

    def _owner_client(self, key: str) -> PeerClient | None:
        owner = self.ring.owner(key)
        return None if owner == self.address else self.clients.get(owner)

    def _peer_failed(self, client: PeerClient) -> None:
        self.metrics.peer_failures.inc()
        if (
            client.consecutive_failures >= self.config.peer_down_after
            and client.address in self.clients
            and client.address not in self.down
        ):
            log.warning("peer %s is down: routing around it", escaped(client.address))
            self.down.add(client.address)
            self._rebuild_ring()
        if self._probe_task is None or self._probe_task.done():
            self._probe_task = asyncio.get_running_loop().create_task(self._probe_down())

    def _to_probe(self) -> list[str]:
        """Peers out of the ring, and peers with recent errors (HealthCheck reports them
        until one call or probe succeeds)."""
        errored = (a for a, c in self.clients.items() if c.recent_errors())
        return sorted(self.down.union(errored))

    async def _probe_down(self) -> None:
        """Every probe interval, LiveCheck the peers that failed: one that answers is
        back in the ring and forgets its errors. Stops when none is left; a peer removed
        from the list is no longer probed."""
        while addrs := self._to_probe():
            await asyncio.sleep(self.config.peer_probe_interval_ms / 1000.0)
            for addr in addrs:
                await self._probe(addr)

    async def _probe(self, addr: str) -> None:
        """One probe; the client is not held past it (a removed peer's channel must be
        free to go while the loop sleeps)."""
        client = self.clients.get(addr)
        if client is None:
            self.down.discard(addr)
            return
        if await client.probe() and addr in self.down:
            log.info("peer %s is back", escaped(addr))
            self.down.discard(addr)
            self._rebuild_ring()
