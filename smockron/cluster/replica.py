"""What a non-owner knows about a GLOBAL limit: the owner's last answer, minus local hits,
and the budget the owner lent this node.

Pure (``now`` is an argument, no I/O). A non-owner answers GLOBAL requests from here
and queues the hits it admitted for the owner; ``pending`` counts those hits until the
owner confirms them, so a node never admits the same allowance twice while its hits
are in flight. The owner's newest word wins (a confirmation or an UpdatePeerGlobals
broadcast); between them the replica is conservative: remaining only goes down, and
returns to ``limit`` once the owner's ``reset_time`` has passed.

Words arrive in any order (a broadcast read before this node's hits were applied can
land after the answer to them), so a smockron owner stamps each word (``VERSION``, from a
counter that only increases, in the response metadata; ``owner`` names it) and an older
word never replaces a newer one. A word that lands while this node's hits are in flight
to the owner may or may not count them; it waits (``parked``) until they are answered,
then the newest word is installed and the hits it counts leave ``pending``. So, within a
window, ``remaining`` never rises but by negative hits, a reset, or hits lost with a
failed sync. A word without a stamp (a Gubernator owner) is installed when it arrives.

What this node may admit is its ``budget``, not the whole remaining: the other nodes
spend the same remaining meanwhile. The owner lends the budget with its answer to this
node's hits (``lending.ALLOWANCE``) and holds it for this node; the lease lasts
``lease_ms`` from the moment the hits were sent. Without a lease (an owner that does not
lend, a new window, a lease run out) the budget is an equal share of the remaining,
``ceil(remaining / nodes)``, which the owner does not hold: admitting from it asks for
a sync soon, as does an answer that leaves under a tenth of the limit in the budget.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from smockron.cluster.lending import ALLOWANCE, LOAN
from smockron.cluster.model import (
    Algorithm,
    Behavior,
    RateLimitRequest,
    RateLimitResponse,
    Status,
)

VERSION = "smockron-global-version"
"""Response metadata of an owner's word (an answer to GLOBAL hits a peer sent, a
broadcast's status): its stamp, increasing per owner. A Gubernator node ignores it."""

_MAX_WAIT = 2
"""Flights a parked word waits to land while others are still in flight."""

_RESET_REMAINING = int(Behavior.RESET_REMAINING)
_DRAIN_OVER_LIMIT = int(Behavior.DRAIN_OVER_LIMIT)


class Word(NamedTuple):
    """An owner's stamped answer, kept until it can be installed."""

    response: RateLimitResponse
    algorithm: Algorithm
    duration: int
    version: int


@dataclass(slots=True)
class Replica:
    limit: int
    remaining: int
    reset_time: int
    algorithm: Algorithm
    duration: int
    pending: int = 0
    """Hits admitted here and sent (or about to be sent) to the owner, not yet counted by
    the word installed."""
    budget: int = 0
    """Hits this node may still admit before the owner's next word."""
    lease_until: int = 0
    """The owner holds ``budget`` for this node until then; 0: not lent, an equal share."""
    loan: int = 0
    """The number of the owner's latest grant seen here (answers with older ones are late)."""
    version: int = 0
    """The owner's stamp on the word installed (0: none, a Gubernator owner's)."""
    owner: str = ""
    """Who stamped it: stamps are compared only with the same owner's."""
    flights: int = 0
    """Syncs carrying hits of this key in flight to the owner."""
    landed: int = 0
    """Hits of syncs the owner answered while a word was parked: in ``pending`` until it
    is installed (it counts them)."""
    parked: Word | None = None
    """The newest word, waiting for ``flights`` to land."""
    waited: int = 0
    """Flights landed since ``parked`` was first parked, others still in flight."""


class Answer(NamedTuple):
    response: RateLimitResponse
    hits: int
    """Hits admitted here, to send to the owner."""
    urgent: bool
    """The budget is nearly spent (or not lent): sync sooner than the sync wait."""


class ReplicaCache:
    def __init__(
        self,
        max_keys: int = 50_000,
        *,
        lease_ms: int = 1000,
        nodes: Callable[[], int] = lambda: 1,
    ) -> None:
        self._max_keys = max_keys
        self._lease = lease_ms
        self._nodes = nodes
        self._items: OrderedDict[str, Replica] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: str) -> Replica | None:
        return self._items.get(key)

    def install(
        self,
        key: str,
        resp: RateLimitResponse,
        algorithm: Algorithm,
        duration: int,
        sent_at: int | None = None,
    ) -> None:
        """The owner's answer for ``key``; local pending hits are kept. With ``sent_at``,
        an answer to this node's hits sent then: its grant (``ALLOWANCE``, ``LOAN`` in its
        metadata) replaces the lease unless an answer the owner decided later came first;
        without a grant the owner holds nothing for this node. A broadcast keeps the
        lease. A stamped answer older than the one held is dropped (its grant still
        counts); one that lands while this node's hits are in flight waits for them."""
        if resp.error:
            return
        old = self._items.get(key)
        version = _int(resp.metadata.get(VERSION, "0"))
        if old is not None and version:
            if sent_at is not None:
                self._grant(old, resp.metadata, sent_at)
                sent_at = None
            owner = resp.metadata.get("owner", "")
            newest = old.parked.version if old.parked is not None else old.version
            if owner == old.owner and version <= newest:
                return  # the owner said something newer since
            if old.flights:
                if old.parked is None:
                    old.waited = 0
                old.parked = Word(resp, algorithm, duration, version)
                return
        self._put(key, old, resp, algorithm, duration, sent_at)

    def _put(
        self,
        key: str,
        old: Replica | None,
        resp: RateLimitResponse,
        algorithm: Algorithm,
        duration: int,
        sent_at: int | None = None,
    ) -> None:
        version = _int(resp.metadata.get(VERSION, "0"))
        item = Replica(resp.limit, resp.remaining, resp.reset_time, algorithm, duration)
        item.version, item.owner = version, resp.metadata.get("owner", "") if version else ""
        if old is not None:
            item.pending, item.budget = old.pending - old.landed, old.budget
            item.lease_until, item.loan = old.lease_until, old.loan
            item.flights = old.flights
        if sent_at is not None:
            self._grant(item, resp.metadata, sent_at)
        if not item.lease_until:
            item.budget = self._equal_share(resp.remaining) - item.pending
        self._items[key] = item
        self._items.move_to_end(key)
        while len(self._items) > self._max_keys:
            self._items.popitem(last=False)

    def _grant(self, item: Replica, metadata: dict[str, str], sent_at: int) -> None:
        number = _int(metadata.get(LOAN, "0"))
        if not number:  # an owner that does not lend
            item.lease_until = 0
            return
        if number <= item.loan:  # late: the owner decided a newer grant since
            return
        item.loan = number
        allowance = metadata.get(ALLOWANCE)
        if allowance is None:
            item.lease_until = 0
        else:
            item.budget = _int(allowance) - (item.pending - item.landed)
            item.lease_until = sent_at + self._lease

    def sending(self, key: str, hits: int) -> None:
        """``hits`` of ``key`` are about to be sent to the owner (0: a sync that carries
        none, which any word may count or not alike)."""
        item = self._items.get(key)
        if item is not None and hits:
            item.flights += 1

    def confirm(
        self,
        key: str,
        hits: int,
        resp: RateLimitResponse | None,
        algorithm: Algorithm,
        sent_at: int | None = None,
    ) -> None:
        """The owner applied (``resp``) or lost (``None``) ``hits`` sent from here at
        ``sent_at`` (announced with ``sending``)."""
        item = self._items.get(key)
        if item is not None:
            flew = bool(hits) and item.flights > 0
            if flew:
                item.flights -= 1
            if flew and resp is not None and _int(resp.metadata.get(VERSION, "0")):
                item.landed += hits  # counted by this answer: out with the word that counts it
            else:
                item.pending -= hits
        if resp is not None:
            self.install(key, resp, algorithm, item.duration if item else 0, sent_at)
        item = self._items.get(key)
        if item is None:
            return
        if item.parked is not None and item.flights:
            item.waited += 1
        if not item.flights or item.waited >= _MAX_WAIT:
            self._settle(key, item)

    def _settle(self, key: str, item: Replica) -> None:
        """Install the newest word held back, which counts every hit that landed
        meanwhile: when no hits are in flight, or when a word has waited for
        ``_MAX_WAIT`` flights to land (syncs that overlap without end, an owner slower
        than the sync wait), as the node must hear of the other nodes' hits; a hit still
        in flight then may count twice until it lands."""
        parked, item.parked = item.parked, None
        if parked is not None:
            self._put(key, item, parked.response, parked.algorithm, parked.duration)
            item = self._items.get(key, item)
        else:
            item.pending -= item.landed
        item.landed = 0

    def answer(self, req: RateLimitRequest, now: int) -> Answer | None:
        """The answer and the hits to send to the owner, or None when only the owner can
        answer: a key with no replica yet, a different algorithm, or RESET_REMAINING.

        Hits beyond the budget are refused and not sent; with DRAIN_OVER_LIMIT what is
        left of the budget is taken and sent.
        """
        item = self._items.get(req.hash_key)
        if item is None or item.algorithm != req.algorithm or int(req.behavior) & _RESET_REMAINING:
            return None
        self._items.move_to_end(req.hash_key)
        if now >= item.reset_time:  # a new window: the full limit, an equal share of it
            item.limit, item.remaining = req.limit, req.limit
            item.reset_time = now + max(req.duration, 0)
            item.lease_until = 0
            item.budget = self._equal_share(req.limit) - item.pending
        base = item.remaining + (req.limit - item.limit)
        available = max(base - item.pending, 0)
        if item.lease_until and now >= item.lease_until:  # the owner no longer holds it
            item.lease_until = 0
            item.budget = min(item.budget, self._equal_share(available))
        budget = max(min(item.budget, available), 0)
        hits = req.hits
        if hits == 0:  # a query is always UNDER_LIMIT, as on the owner
            resp = RateLimitResponse(Status.UNDER_LIMIT, req.limit, available, item.reset_time)
            return Answer(resp, 0, self._urgent(item, req.limit))
        if hits > budget:
            taken = budget if int(req.behavior) & _DRAIN_OVER_LIMIT else 0
            self._spend(item, taken)
            resp = RateLimitResponse(Status.OVER_LIMIT, req.limit, budget - taken, item.reset_time)
            return Answer(resp, taken, available > budget)  # more may be lent: ask soon
        self._spend(item, hits)
        left = available - hits
        ceiling = _ceiling(req)
        if ceiling is not None:
            left = min(left, ceiling)
        resp = RateLimitResponse(Status.UNDER_LIMIT, req.limit, left, item.reset_time)
        return Answer(resp, hits, not item.lease_until or self._urgent(item, req.limit))

    def fresh(self, req: RateLimitRequest, now: int) -> Answer | None:
        """Gubernator's answer for a key this node has not heard of: a full local bucket
        (its window from ``created_at``), spent like a replica; the owner's word replaces
        it with its next answer. None when a replica exists or only the owner can answer."""
        if req.hash_key in self._items or int(req.behavior) & _RESET_REMAINING:
            return None
        full = req.limit if req.algorithm != Algorithm.LEAKY_BUCKET else req.burst or req.limit
        start = req.created_at if req.created_at is not None else now
        resp = RateLimitResponse(Status.UNDER_LIMIT, req.limit, full, start + max(req.duration, 0))
        self.install(req.hash_key, resp, req.algorithm, req.duration)
        return self.answer(req, now)

    def forget(self, key: str) -> None:
        self._items.pop(key, None)

    def _equal_share(self, remaining: int) -> int:
        return -(-max(remaining, 0) // max(self._nodes(), 1))

    @staticmethod
    def _spend(item: Replica, hits: int) -> None:
        item.pending += hits
        item.budget -= hits

    @staticmethod
    def _urgent(item: Replica, limit: int) -> bool:
        return item.budget * 10 < limit


def _ceiling(req: RateLimitRequest) -> int | None:
    """The most ``remaining`` can be after a give-back, as the owner's algorithm has it:
    the token bucket has no ceiling (negative hits raise it above ``limit`` until the
    window ends), the leaky bucket and the history rule stop at ``burst`` (default
    ``limit``), the sliding window at ``limit``."""
    if req.algorithm == Algorithm.TOKEN_BUCKET:
        return None
    if req.algorithm == Algorithm.SLIDING_WINDOW:
        return req.limit
    return req.burst or req.limit


def _int(text: str) -> int:
    try:
        return max(int(text), 0)
    except ValueError:
        return 0
