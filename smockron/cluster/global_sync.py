"""GLOBAL behaviour's two asynchronous flows.

* Hits: a non-owner answers from its replica and queues the hits it admitted; within
  ``sync_wait`` they are summed per key and sent to each owner in GetPeerRateLimits
  calls of at most ``batch_limit`` keys. The owner's answers update the replicas.
* Broadcasts: an owner that applied GLOBAL hits queues the key; within ``sync_wait`` it
  reads each key's current state (a zero-hit check) and sends it to every other node in
  UpdatePeerGlobals calls of at most ``batch_limit`` keys.

Each hits item names the sending node and the hits it was asked for (``lending.PEER``,
``lending.DEMAND`` in the request metadata); the owner answers with the budget it lends
that node (see lending.py and replica.py).

The owner stamps each answer to GLOBAL hits and each broadcast status (``replica.VERSION``
in the response metadata, with ``owner``): the stamps order its words, which arrive in
any order, so a non-owner never installs an older one over a newer one (replica.py).

Summed hits carry DRAIN_OVER_LIMIT: the sending node has already admitted them, so the
owner must count as many of them as still fit rather than refuse the whole sum
(Gubernator refuses it and undercounts).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from typing import Any, Protocol

from smockron.cluster import convert, lending
from smockron.cluster.metrics import ClusterMetrics
from smockron.cluster.model import Behavior, RateLimitRequest, RateLimitResponse
from smockron.cluster.pb import peers_pb2
from smockron.cluster.peers import PeerClient
from smockron.cluster.replica import VERSION, ReplicaCache
from smockron.ratelog import RateLimitedLog

log = logging.getLogger("smockron.cluster.global")
_lost_log = RateLimitedLog(log, interval=1.0)

_OWNER_ONLY = Behavior.RESET_REMAINING | Behavior.DRAIN_OVER_LIMIT


class Checker(Protocol):
    def check(
        self, requests: Sequence[RateLimitRequest], now_ms: int | None = None
    ) -> list[RateLimitResponse]: ...


OwnerOf = Callable[[str], PeerClient | None]
"""The client of a key's owner, or None when this node owns it."""


class GlobalSync:
    def __init__(
        self,
        *,
        limiter: Checker,
        replicas: ReplicaCache,
        owner_of: OwnerOf,
        peers: Callable[[], list[PeerClient]],
        on_peer_failure: Callable[[PeerClient], None] = lambda peer: None,
        sync_wait_ms: float = 100.0,
        batch_limit: int = 1000,
        timeout_ms: float = 500.0,
        clock: Callable[[], int],
        address: str = "",
        name: str = "",
        metrics: ClusterMetrics | None = None,
    ) -> None:
        """``address``: this node's, when it names itself to lending owners; ``name``:
        this node's, with its broadcasts; ``metrics``: where the duration of each round
        and failed calls are counted."""
        self._name = name
        self._stamp = 0
        self._metrics = metrics or ClusterMetrics()
        self._timeout_ms = timeout_ms
        self._limiter = limiter
        self._replicas = replicas
        self._owner_of = owner_of
        self._peers = peers
        self._on_peer_failure = on_peer_failure
        self._wait = sync_wait_ms / 1000.0
        self._limit = batch_limit
        self._clock = clock
        self._address = address
        self._hits: dict[str, RateLimitRequest] = {}
        self._demand: dict[str, int] = {}
        self._asking: dict[str, tuple[RateLimitRequest, int]] = {}
        """Keys this node was asked hits of, each with a zero-hit copy of its request and
        when it was last asked: one idle for a sync wait gives its loan back."""
        self._closed = False
        self._broadcasts: dict[str, RateLimitRequest] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[bool]] = set()
        self.hits_sent = 0
        self.broadcasts_sent = 0

    def stamp(self) -> str:
        """The next stamp of this owner's words: increasing, and from the clock, so also
        across restarts. Take it when the state it stamps is read."""
        self._stamp = max(self._stamp + 1, self._clock() * 1000)
        return str(self._stamp)

    def queued(self) -> tuple[int, int]:
        """Keys waiting for the next round: hits for their owners, broadcasts of owned
        state (Gubernator's global send and global queue lengths)."""
        return len(self._hits), len(self._broadcasts)

    # -- queueing ---------------------------------------------------------------------
    def queue_hits(
        self, req: RateLimitRequest, hits: int, urgent: bool = False, demand: int | None = None
    ) -> None:
        """Hits admitted here for a key another node owns (0 still refreshes the replica),
        out of ``demand`` asked (default: ``req.hits``)."""
        key = req.hash_key
        agg = self._hits.get(key)
        if agg is None:
            behavior = (req.behavior & ~Behavior.RESET_REMAINING) | Behavior.DRAIN_OVER_LIMIT
            # a lending node's hits count when they reach the owner; Gubernator's carry
            # the first request's created_at (the window a fresh local bucket opened)
            created_at = req.created_at if not self._address else None
            self._hits[key] = replace(
                req, hits=hits, behavior=Behavior(behavior), created_at=created_at, metadata={}
            )
        else:
            agg.hits += hits
        asked = req.hits if demand is None else demand
        self._demand[key] = self._demand.get(key, 0) + max(asked, 0)
        if asked > 0 and self._address:
            self._asked(key, self._hits[key])
        self._schedule(len(self._hits), urgent)

    def forwarded(self, req: RateLimitRequest) -> None:
        """``req`` went to its owner, which lent this node a budget with its answer: give
        it back once the key is idle, as after queued hits."""
        if req.hits > 0:
            behavior = (req.behavior & ~Behavior.RESET_REMAINING) | Behavior.DRAIN_OVER_LIMIT
            self._asked(req.hash_key, replace(req, behavior=Behavior(behavior)))
            self._schedule(len(self._hits))

    def _asked(self, key: str, req: RateLimitRequest) -> None:
        seen = self._asking.get(key)
        template = replace(req, hits=0, created_at=None, metadata={}) if seen is None else seen[0]
        self._asking[key] = (template, self._clock())

    def queue_broadcast(self, req: RateLimitRequest, urgent: bool = False) -> None:
        """This node owns ``req``'s key and changed it: tell the other nodes soon."""
        if req.hash_key not in self._broadcasts:
            behavior = Behavior(req.behavior & ~_OWNER_ONLY)
            self._broadcasts[req.hash_key] = replace(
                req, hits=0, behavior=behavior, created_at=None, metadata={}
            )
        self._schedule(len(self._broadcasts), urgent)

    def _schedule(self, size: int, urgent: bool = False) -> None:
        """Flush within the sync wait; within an eighth of it when a key is nearly used up,
        because that is when a stale replica admits too much."""
        if size >= self._limit:
            self.flush()
            return
        loop = asyncio.get_running_loop()
        delay = self._wait / 8 if urgent else self._wait
        if self._timer is None:
            self._timer = loop.call_later(delay, self.flush)
        elif urgent and self._timer.when() > loop.time() + delay:
            self._timer.cancel()
            self._timer = loop.call_later(delay, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        hits, self._hits = self._hits, {}
        demand, self._demand = self._demand, {}
        self._give_back_idle(hits, demand)
        for key, req in hits.items():
            if self._address:  # a lending node names itself and its demand
                asked = str(demand.get(key, 0))
                req.metadata = {lending.PEER: self._address, lending.DEMAND: asked}
        broadcasts, self._broadcasts = self._broadcasts, {}
        loop = asyncio.get_running_loop()
        for kind, coro in (
            ("hits", self._send_hits(hits)),
            ("broadcast", self._send_broadcasts(broadcasts)),
        ):
            task = loop.create_task(self._timed(kind, coro))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._asking and not self._closed:  # come back for the keys that go idle
            self._timer = loop.call_later(self._wait, self.flush)

    def _give_back_idle(self, hits: dict[str, RateLimitRequest], demand: dict[str, int]) -> None:
        """A key not asked for during a sync wait gets a zero-hit sync that asks nothing:
        the owner stops holding a loan for this node, so its clients can use it."""
        now = self._clock()
        idle_ms = self._wait * 1000
        for key, (template, asked_at) in list(self._asking.items()):
            if now - asked_at >= idle_ms:
                del self._asking[key]
                if key not in hits:
                    hits[key] = replace(template)
                    demand[key] = 0

    # -- sending ----------------------------------------------------------------------
    async def _timed(self, kind: str, coro: Coroutine[Any, Any, bool]) -> bool:
        """One round's duration, when it sent anything (Gubernator's send/broadcast timers)."""
        start = time.perf_counter()
        sent = await coro
        if sent:
            self._metrics.global_sync_duration.labels(kind).observe(time.perf_counter() - start)
        return sent

    async def _send_hits(self, hits: dict[str, RateLimitRequest]) -> bool:
        if not hits:
            return False
        by_owner: dict[str, tuple[PeerClient, list[RateLimitRequest]]] = {}
        local: list[RateLimitRequest] = []
        for req in hits.values():
            owner = self._owner_of(req.hash_key)
            if owner is None:  # the ring changed: this node owns the key now
                local.append(req)
            else:
                by_owner.setdefault(owner.address, (owner, []))[1].append(req)
        if local:
            for req, resp in zip(local, self._limiter.check(local), strict=True):
                self._replicas.confirm(req.hash_key, req.hits, resp, req.algorithm)
                self.queue_broadcast(req)
        await asyncio.gather(*(self._send_to_owner(p, reqs) for p, reqs in by_owner.values()))
        return True

    async def _send_to_owner(self, peer: PeerClient, reqs: list[RateLimitRequest]) -> None:
        for start in range(0, len(reqs), self._limit):
            chunk = reqs[start : start + self._limit]
            sent_at = self._clock()
            for req in chunk:
                self._replicas.sending(req.hash_key, req.hits)
            try:
                resps: Sequence[RateLimitResponse | None] = await peer.get_peer_rate_limits(
                    chunk, self._timeout_ms
                )
                self.hits_sent += len(chunk)
            except Exception as exc:
                _lost_log.warning("GLOBAL hits to %s lost: %s", peer.address, exc)
                self._metrics.global_sync_errors.labels("hits").inc()
                self._on_peer_failure(peer)
                resps = [None] * len(chunk)
            for req, resp in zip(chunk, resps, strict=True):
                self._replicas.confirm(req.hash_key, req.hits, resp, req.algorithm, sent_at)

    async def _send_broadcasts(self, broadcasts: dict[str, RateLimitRequest]) -> bool:
        if not broadcasts:
            return False
        reqs = list(broadcasts.values())
        now = self._clock()
        statuses = self._limiter.check(reqs, now)
        for resp in statuses:
            resp.metadata = {"owner": self._name, VERSION: self.stamp()}
        updates = [
            peers_pb2.UpdatePeerGlobal(
                key=req.hash_key,
                status=convert.response_to_pb(resp),
                algorithm=int(req.algorithm),  # type: ignore[arg-type]
                duration=req.duration,
                created_at=now,
            )
            for req, resp in zip(reqs, statuses, strict=True)
            if not resp.error
        ]
        peers = self._peers()
        if not updates or not peers:
            return False
        chunks = [updates[i : i + self._limit] for i in range(0, len(updates), self._limit)]
        results = await asyncio.gather(
            *(
                peer.update_peer_globals(chunk, self._timeout_ms)
                for peer in peers
                for chunk in chunks
            ),
            return_exceptions=True,
        )
        failed = sum(1 for r in results if isinstance(r, BaseException))
        self.broadcasts_sent += len(results) - failed
        if failed:
            self._metrics.global_sync_errors.labels("broadcast").inc(failed)
        return True

    async def close(self) -> None:
        self._closed = True
        self.flush()
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
