"""A cluster node: routes each request to its owner, answers GLOBAL ones locally.

``Node`` implements the ``RateLimiter`` protocol that the gRPC, HTTP and Envoy fronts
call. Per request: the owner is ``ring.owner(name + "_" + unique_key)`` over the peers'
gRPC addresses; requests this node owns go to the LocalLimiter in one call; others are
forwarded over PeersV1 (batched per peer unless NO_BATCHING). A forward that fails
counts against the peer; after ``peer_down_after`` consecutive failures the peer leaves
the ring until it answers a LiveCheck again, and the failed items are answered locally
rather than failed. GLOBAL requests follow ``global_sync``; what each node may admit
on its own follows ``lending`` (the owner's side) and ``replica`` (a non-owner's).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from smockron.cluster import lending
from smockron.cluster.config import ClusterConfig, peer_address_of
from smockron.cluster.convert import algorithm_from_int
from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.global_sync import GlobalSync
from smockron.cluster.local import LocalLimiter, epoch_ms
from smockron.cluster.metrics import ClusterMetrics
from smockron.cluster.model import MAX_BATCH as MAX_BATCH  # re-exported for the fronts
from smockron.cluster.model import Behavior, RateLimitRequest, RateLimitResponse, Status
from smockron.cluster.peers import PeerClient
from smockron.cluster.replica import VERSION, ReplicaCache
from smockron.cluster.tls import TLSMaterial
from smockron.core.hashring import HashRing
from smockron.memory import Reclaimer
from smockron.ratelog import RateLimitedLog, escaped

log = logging.getLogger("smockron.cluster.node")

_bad_globals_log = RateLimitedLog(log, interval=1.0)

_LOCAL = "local"
Pending = asyncio.Future[RateLimitResponse]
_GLOBAL = int(Behavior.GLOBAL)
_NO_BATCHING = int(Behavior.NO_BATCHING)
_RESET_REMAINING = int(Behavior.RESET_REMAINING)
_DRAIN_OVER_LIMIT = int(Behavior.DRAIN_OVER_LIMIT)


class Node:
    def __init__(
        self,
        config: ClusterConfig,
        limiter: LocalLimiter | None = None,
        tls: TLSMaterial | None = None,
        metrics: ClusterMetrics | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics if metrics is not None else ClusterMetrics()
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

    # -- membership -------------------------------------------------------------------
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
        for client in closing:
            await client.close()
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
        local: list[int] = []
        waits: list[tuple[int, PeerClient, Pending]] = []
        unbatched: dict[str, list[int]] = {}
        now = self._clock()
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
                answered = self.replicas.answer(req, now)
                if answered is None and not self.lends:
                    if req.created_at is None:  # as Gubernator stamps it, for the owner
                        req = replace(req, created_at=now)
                    answered = self.replicas.fresh(req, now)
                if answered is not None:
                    resp, hits, urgent = answered
                    resp.metadata["owner"] = owner
                    results[i] = resp
                    self.global_sync.queue_hits(req, hits, urgent=urgent)
                    self.metrics.checks.labels("global_replica").inc()
                    continue
                if self.lends:
                    if sent is None:
                        sent = list(requests)
                    req = sent[i] = self._leasing(req)
            if flags & _NO_BATCHING:
                unbatched.setdefault(owner, []).append(i)
            else:
                waits.append((i, client, client.forward(req)))
        if local:
            self._answer_locally(requests, local, results)
        if waits or unbatched:
            await self._collect(sent or requests, results, waits, unbatched, now)
        return [r if r is not None else RateLimitResponse(error="no answer") for r in results]

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
        self.metrics.checks.labels("peer" if peer else _LOCAL).inc(len(resps))
        return resps

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
        self.metrics.checks.labels(route).inc(len(idx) + len(lent))

    def _owned(
        self,
        req: RateLimitRequest,
        resp: RateLimitResponse,
        route: str,
        now: int,
        left: int | None = None,
    ) -> None:
        """After this node decided ``req`` as its owner: broadcast GLOBAL changes, note
        demand, and lend a non-owner that sent GLOBAL hits its share of what is ``left``
        (default: ``resp.remaining``)."""
        resp.metadata["owner"] = self.address
        flags = int(req.behavior)
        if not flags & _GLOBAL:
            return
        if route == "peer":  # orders this answer among the owner's words (replica.py)
            resp.metadata[VERSION] = self.global_sync.stamp()
        if req.hits or flags & _RESET_REMAINING:
            self.global_sync.queue_broadcast(req, urgent=_low(resp))
        peer = req.metadata.get(lending.PEER) if route == "peer" else lending.OWNER
        if peer is None:  # a Gubernator non-owner: it would ignore a loan
            return
        if peer == lending.OWNER:
            if len(self.ring.nodes) > 1:
                self.ledger.ask(req.hash_key, peer, req.hits, now)
            return
        demand = _demand(req)
        if demand <= 0:  # idle there: hold nothing for it (no allowance: no lease)
            number = self.ledger.release(req.hash_key, peer, now)
            resp.metadata[lending.LOAN] = str(number)
            return
        self.ledger.ask(req.hash_key, peer, demand, now)
        remaining = resp.remaining if left is None else left
        amount, number = self.ledger.lend(
            req.hash_key, peer, remaining, resp.reset_time, now,
            limit=resp.limit, nodes=len(self.ring.nodes),
        )  # fmt: skip
        resp.metadata[lending.ALLOWANCE] = str(amount)
        resp.metadata[lending.LOAN] = str(number)

    def _against_loans(self, req: RateLimitRequest, route: str, now: int) -> bool:
        """Is ``req`` a GLOBAL client request (of this node's clients, or forwarded by a
        non-owner) for a key with loans out to other nodes?"""
        flags = int(req.behavior)
        if not flags & _GLOBAL or flags & _RESET_REMAINING or req.hits <= 0:
            return False
        borrower = _borrower(req, route)
        return borrower is not None and self.ledger.reserved(req.hash_key, now, but=borrower) > 0

    def _within_loans(self, req: RateLimitRequest, route: str, now: int) -> RateLimitResponse:
        """Decide a GLOBAL client request from what is not lent to other nodes: hits that
        would need their budgets are refused (drained to what is free)."""
        lent = self.ledger.reserved(req.hash_key, now, but=_borrower(req, route))
        state = self.limiter.check([replace(req, hits=0)], now)[0]
        free = state.remaining - lent
        if state.error or req.hits <= free:
            resp = self.limiter.check([req], now)[0]
            left = resp.remaining
        elif int(req.behavior) & _DRAIN_OVER_LIMIT and free > 0:
            resp = self.limiter.check([replace(req, hits=free)], now)[0]
            left = resp.remaining
            resp.status, resp.remaining = Status.OVER_LIMIT, 0
        else:
            resp = RateLimitResponse(Status.OVER_LIMIT, state.limit, max(free, 0), state.reset_time)
            left = state.remaining
        if not resp.error:
            self._owned(req, resp, route, now, left)
        return resp

    async def _collect(
        self,
        requests: Sequence[RateLimitRequest],
        results: list[RateLimitResponse | None],
        waits: list[tuple[int, PeerClient, Pending]],
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
        self.metrics.checks.labels("forwarded").inc(forwarded)
        if failed:
            failed.sort()
            self._answer_locally(requests, failed, results, route="owner_failed")

    def _after_forward(
        self, req: RateLimitRequest, resp: RateLimitResponse | None, sent_at: int
    ) -> None:
        """A GLOBAL answer fetched from the owner seeds this node's replica and lease."""
        if resp is not None and int(req.behavior) & _GLOBAL:
            self.replicas.install(req.hash_key, resp, req.algorithm, req.duration, sent_at)
            resp.metadata.pop(lending.LOAN, None)
            resp.metadata.pop(VERSION, None)
            if resp.metadata.pop(lending.ALLOWANCE, None) is not None:
                self.global_sync.forwarded(req)

    def _leasing(self, req: RateLimitRequest) -> RateLimitRequest:
        """A GLOBAL request forwarded to its owner: names this node, so the owner lends it
        a budget with the answer."""
        metadata = {**req.metadata, lending.PEER: self.address}
        return replace(req, metadata=metadata)

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


def _borrower(req: RateLimitRequest, route: str) -> str | None:
    """Whose loan a GLOBAL request may use besides what is free: OWNER for this node's
    clients, the sender for a request a non-owner forwarded (named, without a demand);
    None for a non-owner's sync, whose hits were already admitted under its loan."""
    if route != "peer":
        return lending.OWNER
    md = req.metadata
    return md.get(lending.PEER) if lending.DEMAND not in md else None


def _demand(req: RateLimitRequest) -> int:
    """Hits a non-owner was asked for (its sync says; else the hits it sent)."""
    try:
        return int(req.metadata.get(lending.DEMAND, req.hits))
    except ValueError:
        return req.hits


def _low(resp: RateLimitResponse) -> bool:
    """Nearly used up: under a tenth of the limit left."""
    return resp.remaining * 10 < resp.limit
