"""Master and gatekeepers on a simulated clock: the real Engine and Decider, no sockets.

Events run in time order: requests arriving at gatekeepers, delayed requests waking,
accounting reaching the master and DELAY_UNTILs reaching each gatekeeper, each after its
own latency. Exact and fast, so accuracy properties can be checked on any interleaving
(hypothesis) and the cause of a miss read off the trace.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from smockron.core.rules import Rule
from smockron.gatekeeper._decider import ACCEPT, DELAY, Decider, Decision, Waiting
from smockron.gatekeeper._firstline import Line
from smockron.master.domains import DomainPolicy
from smockron.master.engine import Engine
from smockron.master.stores.memory import MemoryStore
from smockron.wire.codec import ACCEPTED, DELAYED, Control, decode_control, encode_accounting

DOMAIN = b"api"
T0 = 1_700_000_000_000


@dataclass
class Outcome:
    admitted: list[tuple[int, int, bytes]] = field(default_factory=list)
    """(time, gatekeeper, identifier) of every request that reached the resource."""
    rejected: int = 0
    delayed: dict[bytes, int] = field(default_factory=dict)
    """Per identifier: requests that waited before going (or were rejected after)."""

    def count(self, ident: bytes, until: int | None = None) -> int:
        return sum(1 for t, _g, i in self.admitted if i == ident and (until is None or t <= until))


@dataclass
class Network:
    rules: tuple[Rule, ...]
    gatekeepers: int = 1
    algorithm: str = "history"
    latency_ms: Sequence[int] = (1,)
    """Per gatekeeper: how long its accounting takes to reach the master, and the
    master's DELAY_UNTIL to reach it (a gatekeeper with a long one is 'uninformed')."""
    first_line: bool = True
    max_delay_ms: int = 5000
    outcome: Outcome = field(default_factory=Outcome)

    def __post_init__(self) -> None:
        self.engine = Engine({"api": DomainPolicy(self.rules, self.algorithm)}, MemoryStore())
        self.deciders = [Decider(self.max_delay_ms) for _ in range(self.gatekeepers)]
        if self.first_line:
            for d in self.deciders:
                d.set_line(DOMAIN, Line.of(self.algorithm, self.rules))
        self._events: list[tuple[int, int, Callable[[int], None]]] = []
        self._seq = itertools.count()

    def _at(self, t: int, action: Callable[[int], None]) -> None:
        heapq.heappush(self._events, (t, next(self._seq), action))

    def _latency(self, gk: int) -> int:
        return self.latency_ms[gk % len(self.latency_ms)]

    def request(self, t: int, gk: int, ident: bytes) -> None:
        self._at(t, lambda now: self._arrive(now, gk, ident))

    def run(self, until: int) -> Outcome:
        while self._events and self._events[0][0] <= until:
            t, _n, action = heapq.heappop(self._events)
            action(t)
        return self.outcome

    def _arrive(self, now: int, gk: int, ident: bytes) -> None:
        decision = self.deciders[gk].decide(DOMAIN, ident, now)
        if decision.verdict is ACCEPT:
            self._went(now, gk, ident, decision, None)
        elif decision.verdict is DELAY:
            self.outcome.delayed[ident] = self.outcome.delayed.get(ident, 0) + 1
            if not decision.paced:  # accounted now, as the original gatekeepers do
                self._account(now, gk, ident, decision, decision.until_ms)
            waiting = Waiting(self.deciders[gk], DOMAIN, ident, decision)
            self._at(decision.until_ms, lambda t: self._wake(t, gk, waiting))
        else:
            self.outcome.rejected += 1

    def _wake(self, now: int, gk: int, waiting: Waiting) -> None:
        again = waiting.woke(now)
        if again is not None:
            self._at(again, lambda t: self._wake(t, gk, waiting))
            return
        self.deciders[gk].release()
        ident, decision = waiting.identifier, waiting.decision
        if waiting.rejected:
            self.outcome.rejected += 1
        elif decision.paced:  # accounted when it goes
            self._went(now, gk, ident, decision, waiting.went_at)
        else:
            self.outcome.admitted.append((now, gk, ident))

    def _went(self, now: int, gk: int, ident: bytes, decision: Decision, went: int | None) -> None:
        self.outcome.admitted.append((now, gk, ident))
        self._account(now, gk, ident, decision, went)

    def _account(
        self, now: int, gk: int, ident: bytes, decision: Decision, went: int | None
    ) -> None:
        status = ACCEPTED if went is None else DELAYED
        frames = encode_accounting("api", status, ident, decision.received_ms, went)
        self._at(now + self._latency(gk), lambda t: self._master(t, frames))

    def _master(self, now: int, frames: list[bytes]) -> None:
        for control in map(decode_control, self.engine.process([frames], float(now))):
            for gk, decider in enumerate(self.deciders):
                self._at(now + self._latency(gk), self._deliver(decider, control))

    @staticmethod
    def _deliver(decider: Decider, control: Control) -> Callable[[int], None]:
        def deliver(now: int) -> None:
            decider.control(DOMAIN, control.identifier, control.until_ms, now)

        return deliver
