"""GLOBAL keys in a node's hands. As their owner: the changes broadcast, the demand
noted, a share of what is left lent to the non-owners that sent hits (smockron.cluster
.lending), and client requests decided against what is not lent. As a non-owner: a
request answered from the replica (smockron.cluster.replica) or forwarded to the owner
naming this node, and the owner's answer seeding the replica and its lease. ``Node``
(smockron.cluster.node) is built on it."""

from __future__ import annotations

from dataclasses import replace

from smockron.cluster import lending
from smockron.cluster.global_sync import GlobalSync
from smockron.cluster.local import LocalLimiter
from smockron.cluster.metrics import ClusterMetrics
from smockron.cluster.model import Behavior, RateLimitRequest, RateLimitResponse, Status
from smockron.cluster.replica import VERSION, ReplicaCache
from smockron.core.hashring import HashRing

_GLOBAL = int(Behavior.GLOBAL)
_RESET_REMAINING = int(Behavior.RESET_REMAINING)
_DRAIN_OVER_LIMIT = int(Behavior.DRAIN_OVER_LIMIT)


class GlobalKeys:
    """The GLOBAL part of ``Node``; its state is set up by ``Node.__init__``."""

    address: str
    ring: HashRing
    limiter: LocalLimiter
    metrics: ClusterMetrics
    replicas: ReplicaCache
    ledger: lending.Ledger
    global_sync: GlobalSync
    lends: bool

    def _global_item(
        self, req: RateLimitRequest, owner: str, now: int
    ) -> tuple[RateLimitResponse | None, RateLimitRequest]:
        """A GLOBAL client request another node owns: (the replica's answer, or None, and
        the request as it goes to the owner)."""
        answered = self.replicas.answer(req, now)
        if answered is None and not self.lends:
            if req.created_at is None:  # as Gubernator stamps it, for the owner
                req = replace(req, created_at=now)
            answered = self.replicas.fresh(req, now)
        if answered is not None:
            resp, hits, urgent = answered
            resp.metadata["owner"] = owner
            self.global_sync.queue_hits(req, hits, urgent=urgent)
            self.metrics.checks.labels("global_replica").inc()
            return resp, req
        return None, (self._leasing(req) if self.lends else req)

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
            req.hash_key,
            peer,
            remaining,
            resp.reset_time,
            now,
            limit=resp.limit,
            nodes=len(self.ring.nodes),
        )
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
