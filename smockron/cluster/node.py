"""A cluster node: routes each request to its owner, answers GLOBAL ones locally.

``Node`` implements the ``RateLimiter`` protocol that the gRPC, HTTP and Envoy fronts
call. Per request: the owner is ``ring.owner(name + "_" + unique_key)`` over the peers'
gRPC addresses; requests this node owns go to the LocalLimiter in one call; others are
forwarded over PeersV1 (batched per peer unless NO_BATCHING). A forward that fails
counts against the peer; after ``peer_down_after`` consecutive failures the peer leaves
the ring until it answers a LiveCheck again, and the failed items are answered locally
rather than failed. GLOBAL requests follow ``global_sync``; what each node may admit
on its own follows ``lending`` (the owner's side) and ``replica`` (a non-owner's).

Modules: the peers and ring in ``membership``, GLOBAL keys in ``global_keys``; here the
API, the forwarding of a call's items, expiry and health.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from smockron.cluster import lending
from smockron.cluster.config import ClusterConfig
from smockron.cluster.convert import algorithm_from_int
from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.global_keys import GlobalKeys
from smockron.cluster.global_sync import GlobalSync
from smockron.cluster.local import LocalLimiter, epoch_ms
from smockron.cluster.membership import Membership
from smockron.cluster.metrics import ClusterMetrics
from smockron.cluster.model import MAX_BATCH as MAX_BATCH  # re-exported for the fronts
from smockron.cluster.model import Behavior, RateLimitRequest, RateLimitResponse
from smockron.cluster.peers import PeerClient
from smockron.cluster.replica import ReplicaCache
from smockron.cluster.tls import TLSMaterial
from smockron.core.hashring import HashRing
from smockron.memory import Reclaimer
from smockron.ratelog import RateLimitedLog

log = logging.getLogger("smockron.cluster.node")

_bad_globals_log = RateLimitedLog(log, interval=1.0)

_LOCAL = "local"
Pending = asyncio.Future[RateLimitResponse]
Waits = list[tuple[int, PeerClient, Pending]]
"""Forwarded items: (index, the owner's client, the answer to come)."""
_GLOBAL = int(Behavior.GLOBAL)
_NO_BATCHING = int(Behavior.NO_BATCHING)


class Node(Membership, GlobalKeys):
    """The ``RateLimiter`` the fronts call (see the module docstring); its peers
    (smockron.cluster.membership) and GLOBAL keys (smockron.cluster.global_keys) are
    the two halves it is built on."""

    def __init__(
        self,
        config: ClusterConfig,
        limiter: LocalLimiter | None = None,
        tls: TLSMaterial | None = None,
        metrics: ClusterMetrics | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics if metrics is not None else ClusterMetrics()
        self._counted: dict[str, Any] = {}
        self.tls = tls
        """Peer calls go over TLS with these certificates when set."""
        self.address = config.advertise
        self.limiter = limiter or LocalLimiter(max_keys=config.cache_size)
        self._clock = epoch_ms
        self.ring = HashRing(
            [self.address], config.peer_picker_replicas, hash=config.peer_picker_hash
        )
        self.peer_infos: dict[str, PeerInfo] = {self.address: PeerInfo(self.address)}
        self.in_peer_list = True
        self.clients: dict[str, PeerClient] = {}
        self.down: set[str] = set()
        lease_ms = max(int(3 * config.global_sync_wait_ms), 100)
        self.lends = config.global_mode == "lend"
        """GLOBAL budgets lent by owners; else Gubernator's (a replica spends its whole
        remaining, which an equal share over one node is)."""
        nodes: Callable[[], int] = (lambda: len(self.ring.nodes)) if self.lends else (lambda: 1)
        self.replicas = ReplicaCache(config.cache_size, lease_ms=lease_ms, nodes=nodes)
        # hits admitted under a lease reach the owner within a sync wait of its end
        hold_ms = lease_ms + int(2 * config.global_sync_wait_ms) + 100
        self.ledger = lending.Ledger(hold_ms=hold_ms, max_keys=config.cache_size)
        self.global_sync = GlobalSync(
            limiter=self.limiter,
            replicas=self.replicas,
            owner_of=self._owner_client,
            peers=lambda: list(self.clients.values()),
            on_peer_failure=self._peer_failed,
            sync_wait_ms=config.global_sync_wait_ms,
            batch_limit=config.global_batch_limit,
            timeout_ms=config.global_timeout_ms,
            clock=self._clock,
            address=self.address if self.lends else "",
            name=self.address,
            metrics=self.metrics,
        )
        self._probe_task: asyncio.Task[None] | None = None
        self._reclaim_task: asyncio.Task[None] | None = None
        self._memory = Reclaimer()
        self._closing: list[PeerClient] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._delayed: set[asyncio.Task[None]] = set()

    # -- expiry -----------------------------------------------------------------------
    def start_reclaiming(self) -> None:
        """Sweep expired keys out of the limiter every ``reclaim_interval_ms``, with or
        without traffic (call on the running loop)."""
        if self._reclaim_task is None:
            self._reclaim_task = asyncio.get_running_loop().create_task(self._reclaim())

    async def _reclaim(self) -> None:
        interval = self.config.reclaim_interval_ms / 1000.0
        while True:
            await asyncio.sleep(interval)
            dropped, more = self.limiter.reclaim()
            while more:  # a wave expired: step through it, letting calls in between
                await asyncio.sleep(0)
                step, more = self.limiter.reclaim()
                dropped += step
            memory = self._memory
            if dropped:
                memory.note(dropped, len(self.limiter))
                self.limiter.compact(memory)
            if memory.due:  # also the last collection, once a wave is over
                await asyncio.get_running_loop().run_in_executor(None, memory.reclaim)
            if dropped >= 100_000:
                log.info("reclaimed %d expired keys (%d left)", dropped, len(self.limiter))

    # -- the API ----------------------------------------------------------------------
    async def get_rate_limits(
        self, requests: Sequence[RateLimitRequest]
    ) -> list[RateLimitResponse]:
        """Answer client requests in order, wherever their owners are."""
        results: list[RateLimitResponse | None] = [None] * len(requests)
        now = self._clock()
        local, waits, unbatched, sent = self._dispatch(requests, results, now)
        if local:
            self._answer_locally(requests, local, results)
        if waits or unbatched:
            await self._collect(sent or requests, results, waits, unbatched, now)
        return [r if r is not None else RateLimitResponse(error="no answer") for r in results]

    def _dispatch(
        self,
        requests: Sequence[RateLimitRequest],
        results: list[RateLimitResponse | None],
        now: int,
    ) -> tuple[list[int], Waits, dict[str, list[int]], list[RateLimitRequest] | None]:
        """Each request's way: (indexes to answer here, forwards in a peer's batch,
        indexes sent alone by owner (NO_BATCHING), the requests as forwarded if any
        changed). GLOBAL ones a replica answers go straight into ``results``."""
        local: list[int] = []
        waits: Waits = []
        unbatched: dict[str, list[int]] = {}
        sent: list[RateLimitRequest] | None = None  # a copy once a GLOBAL item names this node
        for i, req in enumerate(requests):
            if not req.unique_key or not req.name:
                local.append(i)  # the limiter words the error like Gubernator
                continue
            owner = self.ring.owner(req.hash_key)
            client = self.clients.get(owner) if owner != self.address else None
            if client is None:
                local.append(i)
                continue
            flags = int(req.behavior)  # IntFlag's own & builds a new flag: slow per item
            if flags & _GLOBAL:
                results[i], req = self._global_item(req, owner, now)
                if results[i] is not None:
                    continue
                if self.lends:
                    if sent is None:
                        sent = list(requests)
                    sent[i] = req
            if flags & _NO_BATCHING:
                unbatched.setdefault(owner, []).append(i)
            else:
                waits.append((i, client, client.forward(req)))
        return local, waits, unbatched, sent

    def answer_here(
        self, requests: Sequence[RateLimitRequest], *, peer: bool = False
    ) -> list[RateLimitResponse] | None:
        """The answers when every item is decided by this node's limiter alone (owned
        here, or sent by a peer, and not GLOBAL); else None: the caller goes through
        ``get_rate_limits`` / ``peer_rate_limits`` on the event loop.

        Safe from a gRPC worker thread: it only reads the ring (swapped whole on change)
        and looks peers up in a dict (one lookup, atomic under the GIL), and the
        LocalLimiter takes its own lock. GLOBAL items, whose bookkeeping lives on the
        event loop, always return None.
        """
        address, owner_of, clients = self.address, self.ring.owner, self.clients
        for req in requests:
            if int(req.behavior) & _GLOBAL:
                return None
            if peer or not req.unique_key or not req.name:
                continue
            owner = owner_of(req.hash_key)
            if owner != address and owner in clients:
                return None
        resps = self.limiter.check(requests)
        for resp in resps:
            if not resp.error:
                resp.metadata["owner"] = address
        self.count("peer" if peer else _LOCAL, len(resps))
        return resps

    def count(self, route: str, checks: int) -> None:
        """``metrics.checks`` by ``route``, its labelled children kept: ``labels`` takes a
        lock and checks its arguments on every call."""
        child = self._counted.get(route)
        if child is None:
            child = self._counted[route] = self.metrics.checks.labels(route)
        child.inc(checks)

    async def peer_rate_limits(
        self, requests: Sequence[RateLimitRequest]
    ) -> list[RateLimitResponse]:
        """GetPeerRateLimits: another node says we own these; decide them here."""
        results: list[RateLimitResponse | None] = [None] * len(requests)
        self._answer_locally(requests, range(len(requests)), results, route="peer")
        return [r for r in results if r is not None]

    def update_globals(self, updates: Iterable[tuple[str, RateLimitResponse, int, int]]) -> None:
        """UpdatePeerGlobals: the owner's current state of GLOBAL keys."""
        received = 0
        for key, resp, algorithm, duration in updates:
            received += 1
            try:
                self.replicas.install(key, resp, algorithm_from_int(algorithm), duration)
            except ValueError:
                self.metrics.bad_globals.inc()
                _bad_globals_log.warning(
                    "UpdatePeerGlobals: unknown algorithm %r for %r", algorithm, key[:200]
                )
        self.metrics.peer_globals.inc(received)

    def _answer_locally(
        self,
        requests: Sequence[RateLimitRequest],
        indexes: Iterable[int],
        results: list[RateLimitResponse | None],
        route: str = _LOCAL,
    ) -> None:
        idx = list(indexes)
        now = self._clock()
        lent: list[int] = []
        if len(self.ledger):
            lent = [i for i in idx if self._against_loans(requests[i], route, now)]
            if lent:
                skip = set(lent)
                idx = [i for i in idx if i not in skip]
        batch = [requests[i] for i in idx]
        for i, req, resp in zip(idx, batch, self.limiter.check(batch), strict=True):
            if not resp.error:
                self._owned(req, resp, route, now)
            results[i] = resp
        for i in lent:
            results[i] = self._within_loans(requests[i], route, now)
        self.count(route, len(idx) + len(lent))

    async def _collect(
        self,
        requests: Sequence[RateLimitRequest],
        results: list[RateLimitResponse | None],
        waits: Waits,
        unbatched: dict[str, list[int]],
        sent_at: int,
    ) -> None:
        failed: list[int] = []
        direct = [(self.clients[addr], idx) for addr, idx in unbatched.items()]
        batched, sent = await asyncio.gather(
            asyncio.gather(*(fut for _, _, fut in waits), return_exceptions=True),
            asyncio.gather(
                *(c.get_peer_rate_limits([requests[i] for i in idx]) for c, idx in direct),
                return_exceptions=True,
            ),
        )
        for (i, client, _), outcome in zip(waits, batched, strict=True):
            if isinstance(outcome, BaseException):
                self._peer_failed(client)
                failed.append(i)
            else:
                results[i] = outcome
        for (client, idx), result in zip(direct, sent, strict=True):
            if isinstance(result, BaseException):
                self._peer_failed(client)
                failed.extend(idx)
            else:
                for i, resp in zip(idx, result, strict=True):
                    results[i] = resp
        for i, _, _ in waits:
            self._after_forward(requests[i], results[i], sent_at)
        for idx in unbatched.values():
            for i in idx:
                self._after_forward(requests[i], results[i], sent_at)
        forwarded = len(waits) + sum(map(len, unbatched.values())) - len(failed)
        self.count("forwarded", forwarded)
        if failed:
            failed.sort()
            self._answer_locally(requests, failed, results, route="owner_failed")

    # -- health -----------------------------------------------------------------------
    def health(self) -> tuple[str, str, int, str]:
        """(status, message, peer_count, advertise_address) as Gubernator reports them,
        with its wording, so what operators grep for is found: one
        ``error returned from local peer.GetLastErr: from host <addr>: ...`` per recent
        peer error (``region peer`` for another data center), and ``this instance is not
        found in the peer list``."""
        local, _ = self.peer_groups()
        here = {p.grpc_address for p in local}
        errors = [
            f"error returned from {'local' if addr in here else 'region'} peer.GetLastErr: "
            f"from host {addr}: {msg}"
            for addr, client in sorted(self.clients.items())
            for msg in client.recent_errors()[-3:]
        ]
        errors.extend(f"from host {a}: peer is down, routed around" for a in sorted(self.down))
        advertise = self.address if self.in_peer_list else ""
        if not advertise:
            errors.append("this instance is not found in the peer list")
        status = "unhealthy" if errors else "healthy"
        return status, "|".join(errors), len(self.peer_infos), advertise

    def peer_groups(self) -> tuple[list[PeerInfo], list[PeerInfo]]:
        """(local, region): the known nodes of this node's data center, this node
        included, and those of other data centers, each sorted by address."""
        mine = self.config.data_center
        local: list[PeerInfo] = []
        region: list[PeerInfo] = []
        for addr, info in sorted(self.peer_infos.items()):
            if addr == self.address:
                info = replace(info, data_center=mine)
            (local if info.data_center == mine else region).append(info)
        return local, region

    async def close(self) -> None:
        await self.global_sync.close()
        for background in (self._probe_task, self._reclaim_task):
            if background is not None:
                background.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await background
        for task in list(self._delayed):  # a reload's delayed close: done below instead
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._closing.extend(self.clients.values())
        self.clients.clear()
        await self._close_removed()
