"""The owner's side of GLOBAL convergence: what each non-owner may admit on its own.

Pure (``now`` is an argument, no I/O). Every time an owner answers a non-owner's GLOBAL
hits (or its first, forwarded request) it lends that node a share of what is left and
holds it: the owner's own requests may use only the remaining minus what is lent out,
and a non-owner admits at most what it was lent until its next sync. So the nodes
never spend the same remaining twice, and no request waits for the owner.

* The share follows demand: the node's fraction of the requested hits for the key (the
  owner's own client hits, and what each non-owner reports with its sync), decayed with
  a half-life, so the node that sees more of the traffic gets more of the remaining.
  Every node counts a tenth of the limit more than it asked, so shares start equal.
* A loan is replaced by the next one to the same node (each sync re-lends), lapses at
  the end of its window, and is held at most ``hold_ms``. A node that was asked for
  nothing since its last sync (it says so after a sync wait without traffic for the key)
  gets no loan: nothing is held for it, and it falls back to an equal share.

The protocol is Gubernator's: the sender's address and its demand ride in the request's
``metadata``, the loan in the response's ``metadata``; a Gubernator node ignores both.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

PEER = "smockron-global-peer"
"""Request metadata: the address of the non-owner sending GLOBAL hits."""
DEMAND = "smockron-global-demand"
"""Request metadata of a sync: hits asked of the sender for the key since its last sync. A
request naming its sender without it is a client request the sender forwarded."""
ALLOWANCE = "smockron-global-allowance"
"""Response metadata: hits the non-owner may admit until its next sync (absent: none held)."""
LOAN = "smockron-global-loan"
"""Response metadata: the loan's number, increasing per key: answers can arrive out of
order, and the non-owner keeps the word of the one the owner decided last."""
OWNER = ""
"""The source name of the owner's own client requests."""


@dataclass(slots=True)
class Loan:
    amount: int
    expires: int
    """The loan is void from here: its window ended or it was held ``hold_ms``."""


@dataclass(slots=True)
class Demand:
    weight: float
    at: int


class Grant(NamedTuple):
    amount: int
    """Hits lent, and held for the node."""
    number: int
    """Increasing per key (from the clock, so also across restarts of the owner)."""


@dataclass(slots=True)
class _Key:
    loans: dict[str, Loan] = field(default_factory=dict)
    demand: dict[str, Demand] = field(default_factory=dict)
    number: int = 0


class Ledger:
    def __init__(self, *, hold_ms: int, half_life_ms: int = 1000, max_keys: int = 50_000) -> None:
        if hold_ms < 1 or half_life_ms < 1:
            raise ValueError(f"hold_ms, half_life_ms must be >= 1: {hold_ms}, {half_life_ms}")
        self._hold = hold_ms
        self._half_life = half_life_ms
        self._max_keys = max_keys
        self._keys: OrderedDict[str, _Key] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def reserved(self, key: str, now: int, *, but: str | None = None) -> int:
        """Hits lent out for ``key`` and still held (all loans, or all but ``but``'s)."""
        entry = self._keys.get(key)
        if entry is None:
            return 0
        return sum(
            loan.amount for peer, loan in entry.loans.items() if peer != but and now < loan.expires
        )

    def ask(self, key: str, source: str, hits: int, now: int) -> None:
        """``source`` (a peer address, or OWNER) was asked for ``hits`` hits of ``key``."""
        demand = self._entry(key).demand
        seen = demand.get(source)
        if seen is None:
            demand[source] = Demand(float(max(hits, 0)), now)
        else:
            seen.weight = self._decayed(seen, now) + max(hits, 0)
            seen.at = now

    def lend(
        self,
        key: str,
        peer: str,
        remaining: int,
        window_end: int,
        now: int,
        *,
        limit: int,
        nodes: int,
    ) -> Grant:
        """Replace ``peer``'s loan: its share of ``remaining`` not lent to the others."""
        entry = self._entry(key)
        free = remaining - self.reserved(key, now, but=peer)
        share = self.share(key, peer, now, prior=max(limit / 10, 1.0), nodes=nodes)
        amount = math.ceil(free * share) if free > 0 else 0
        entry.loans[peer] = Loan(amount, min(window_end, now + self._hold))
        return Grant(amount, self._number(entry, now))

    def release(self, key: str, peer: str, now: int) -> int:
        """``peer`` asked for nothing since its last sync: hold nothing for it. Returns the
        number of this (empty) grant."""
        entry = self._entry(key)
        entry.loans.pop(peer, None)
        return self._number(entry, now)

    @staticmethod
    def _number(entry: _Key, now: int) -> int:
        entry.number = max(entry.number + 1, now * 1000)
        return entry.number

    def share(self, key: str, peer: str, now: int, *, prior: float, nodes: int) -> float:
        """``peer``'s fraction of the recent demand for ``key``, each of the ``nodes``
        counted with ``prior`` hits more than it asked: an equal share until the demand
        is large next to the limit, so the first node to ask does not take everything
        before the others are seen."""
        entry = self._keys.get(key)
        weights = [] if entry is None else [self._decayed(d, now) for d in entry.demand.values()]
        mine = 0.0
        if entry is not None and peer in entry.demand:
            mine = self._decayed(entry.demand[peer], now)
        count = max(nodes, len(weights), 1)
        return (mine + prior) / (sum(weights) + count * prior)

    def forget(self, key: str) -> None:
        self._keys.pop(key, None)

    def _entry(self, key: str) -> _Key:
        entry = self._keys.get(key)
        if entry is None:
            entry = self._keys[key] = _Key()
            while len(self._keys) > self._max_keys:
                self._keys.popitem(last=False)
        else:
            self._keys.move_to_end(key)
        return entry

    def _decayed(self, demand: Demand, now: int) -> float:
        return demand.weight * math.exp2(-max(now - demand.at, 0) / self._half_life)
