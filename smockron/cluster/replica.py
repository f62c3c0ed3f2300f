"""What a non-owner knows about a GLOBAL limit: the owner's last answer, minus local hits.

Pure (``now`` is an argument, no I/O). A non-owner answers GLOBAL requests from here
and queues the hits it admitted for the owner; ``pending`` counts those hits until the
owner confirms them, so a node never admits the same allowance twice while its hits
are in flight. The owner's word wins whenever it arrives (a confirmation or an
UpdatePeerGlobals broadcast); between them the replica is conservative: remaining only
goes down, and returns to ``limit`` once the owner's ``reset_time`` has passed.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from smockron.cluster.model import (
    Algorithm,
    Behavior,
    RateLimitRequest,
    RateLimitResponse,
    Status,
)

_RESET_REMAINING = int(Behavior.RESET_REMAINING)
_DRAIN_OVER_LIMIT = int(Behavior.DRAIN_OVER_LIMIT)


@dataclass(slots=True)
class Replica:
    limit: int
    remaining: int
    reset_time: int
    algorithm: Algorithm
    duration: int
    pending: int = 0
    """Hits admitted here and sent (or about to be sent) to the owner, not yet confirmed."""


class ReplicaCache:
    def __init__(self, max_keys: int = 50_000) -> None:
        self._max_keys = max_keys
        self._items: OrderedDict[str, Replica] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: str) -> Replica | None:
        return self._items.get(key)

    def install(
        self, key: str, resp: RateLimitResponse, algorithm: Algorithm, duration: int
    ) -> None:
        """The owner's current answer for ``key``; local pending hits are kept."""
        if resp.error:
            return
        old = self._items.get(key)
        pending = old.pending if old is not None else 0
        self._items[key] = Replica(
            resp.limit, resp.remaining, resp.reset_time, algorithm, duration, pending
        )
        self._items.move_to_end(key)
        while len(self._items) > self._max_keys:
            self._items.popitem(last=False)

    def confirm(
        self, key: str, hits: int, resp: RateLimitResponse | None, algorithm: Algorithm
    ) -> None:
        """The owner applied (``resp``) or lost (``None``) ``hits`` sent from here."""
        item = self._items.get(key)
        if item is not None:
            item.pending -= hits
        if resp is not None:
            self.install(key, resp, algorithm, item.duration if item else 0)

    def answer(self, req: RateLimitRequest, now: int) -> tuple[RateLimitResponse, int] | None:
        """(response, hits to send to the owner), or None when only the owner can answer.

        None for a key with no replica yet, a different algorithm, or RESET_REMAINING.
        Hits that do not fit are refused and not sent, as the owner would refuse them;
        with DRAIN_OVER_LIMIT what is left is taken and sent.
        """
        item = self._items.get(req.hash_key)
        if item is None or item.algorithm != req.algorithm or int(req.behavior) & _RESET_REMAINING:
            return None
        self._items.move_to_end(req.hash_key)
        if now >= item.reset_time:
            base, reset_time = req.limit, now + max(req.duration, 0)
        else:
            base, reset_time = item.remaining + (req.limit - item.limit), item.reset_time
        available = max(base - item.pending, 0)
        hits = req.hits
        if hits == 0:  # a query is always UNDER_LIMIT, as on the owner
            return RateLimitResponse(Status.UNDER_LIMIT, req.limit, available, reset_time), 0
        if hits > available:
            taken = available if int(req.behavior) & _DRAIN_OVER_LIMIT else 0
            item.pending += taken
            left = available - taken
            return RateLimitResponse(Status.OVER_LIMIT, req.limit, left, reset_time), taken
        item.pending += hits
        left = min(available - hits, req.limit)
        return RateLimitResponse(Status.UNDER_LIMIT, req.limit, left, reset_time), hits

    def forget(self, key: str) -> None:
        self._items.pop(key, None)
