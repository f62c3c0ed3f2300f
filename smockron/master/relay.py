"""What the router makes of its masters' control messages, pure (no sockets): its own
publish counter per domain (:class:`Counters`) and which rules offers it relays
(:class:`Offers`). :mod:`smockron.master.router` says why each is needed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from smockron.master.server import RULES_EVERY_S

MAX_DOMAINS = 10_000
"""Domains the router keeps publish counters and rules offers for (a gatekeeper takes
offers for as many)."""
OFFER_EVERY_S = 0.9 * RULES_EVERY_S
"""A domain's unchanged rules offer is relayed at most this often: about once per
master's period, whichever master sends it first (a little less than the period, so a
master's jitter does not skip one)."""
COUNTER_STALE_S = 5 * RULES_EVERY_S
"""A domain no master has counted for this long (removed by a reload) is no longer
counted by the router either."""


@dataclass(slots=True)
class _Seen:
    """One master's counter for one domain, as the router last heard it."""

    published: int  # the master's count at its last heartbeat
    received: int  # what the router had received from it then
    lost: int = 0  # published by it, never received by the router (summed over heartbeats)
    rebase: bool = False  # its connection came back: the next counter is a new baseline


@dataclass(slots=True)
class Counters:
    """The router's publish counter per domain, from its masters' (pure: no sockets).

    The count of a domain is what the router relayed of its DELAY_UNTILs plus what the
    masters' counters show the router never received. Why not the sum of the masters'
    latest counts: a master's count runs ahead of its last heartbeat by what it has
    published since, which the router relays at once; a gatekeeper comparing the sum
    with what it received would take that for a loss whenever one master's heartbeat
    was older than another's at one counter and newer at the next. What the router
    counts instead is what it sent before it publishes the count, so a gatekeeper's
    difference is exactly what was lost: on the way from a master to the router (found
    at that master's next heartbeat: a master's heartbeat reaches the router after every
    DELAY_UNTIL it counts, on the same connection) or from the router to it.

    A master whose control connection comes back (it restarted, or the network failed)
    starts a new baseline at its next counter, as a gatekeeper's own reconnection does
    (:meth:`reconnected`); so does a count that went down. The router's count goes on
    growing (a gatekeeper behind the router does not see masters restart; the RESYNC it
    needs then comes from a later loss, if any, or from nothing: a restarted master has
    lost nothing the gatekeeper holds). What a master published while the router was not
    subscribed is not counted as lost: the router cannot tell it from a restarted
    master's new count. A restarted router starts from zero, which a gatekeeper reads as
    a new master (it reconnected anyway, and asked for a resync).
    """

    received: list[dict[bytes, int]]
    """Per master, per domain topic (``domain\\0``): DELAY_UNTILs received (and relayed)."""
    seen: list[dict[bytes, _Seen]] = field(default_factory=list)
    heard: dict[bytes, float] = field(default_factory=dict)
    """Domains (topic frame) a master counted, and when last (monotonic)."""
    lost: int = 0

    @classmethod
    def of(cls, masters: int) -> Counters:
        return cls([{} for _ in range(masters)], [{} for _ in range(masters)])

    def delivered(self, master: int, counts: dict[bytes, int]) -> None:
        """DELAY_UNTILs of ``master`` received and relayed, per domain topic."""
        received = self.received[master]
        for name, n in counts.items():
            if name in received:
                received[name] += n
            elif len(received) < MAX_DOMAINS:
                received[name] = n

    def heartbeat(self, master: int, domain_topic: bytes, published: int, now: float) -> int:
        """A master's counter for a domain; how many of its DELAY_UNTILs never reached the
        router since its previous counter (0 at the first, and after a restart)."""
        seen = self.seen[master]
        got = self.received[master].get(domain_topic, 0)
        last = seen.get(domain_topic)
        if last is None:
            if len(seen) >= MAX_DOMAINS or (
                domain_topic not in self.heard and len(self.heard) >= MAX_DOMAINS
            ):
                return 0
            seen[domain_topic] = _Seen(published, got)
            self.heard[domain_topic] = now
            return 0
        self.heard[domain_topic] = now
        lost = 0
        if published >= last.published and not last.rebase:  # else counting starts again
            lost = max(0, (published - last.published) - (got - last.received))
        last.published, last.received, last.rebase = published, got, False
        last.lost += lost
        self.lost += lost
        return lost

    def reconnected(self, master: int) -> None:
        """``master``'s control connection was lost: its next counter of each domain is a
        new baseline, as a gatekeeper's own reconnection makes one. The master restarted
        (its count starts again: one that has already passed the old count by then is
        no loss), or what it published while the router was not subscribed is unknown.
        What it lost before stays counted: the router's count never goes back."""
        for seen in self.seen[master].values():
            seen.rebase = True

    def count(self, domain_topic: bytes) -> int:
        """The router's counter of a domain: relayed, plus lost on the way to the router."""
        total = 0
        for master, received in enumerate(self.received):
            total += received.get(domain_topic, 0)
            seen = self.seen[master].get(domain_topic)
            if seen is not None:
                total += seen.lost
        return total

    def current(self, now: float) -> list[tuple[bytes, int]]:
        """``(domain, count)`` of every domain a master counted lately (stale ones go)."""
        out = []
        for name, when in list(self.heard.items()):
            if now - when > COUNTER_STALE_S:
                del self.heard[name]
                continue
            out.append((name[:-1], self.count(name)))
        return sorted(out)


@dataclass(slots=True)
class Offers:
    """Which rules offers to relay: a domain's offer when it changed, or when the last
    one relayed is ``OFFER_EVERY_S`` old (pure: no sockets)."""

    last: dict[bytes, tuple[tuple[bytes, ...], float, int]] = field(default_factory=dict)
    """Domain -> (frames, when relayed, from which master)."""
    disagree: int = 0

    def fresh(self, frames: Sequence[bytes], master: int, now: float) -> bool:
        key = tuple(frames)
        domain = frames[2] if len(frames) > 2 else b""
        last = self.last.get(domain)
        if last is not None and last[0] == key and now - last[1] < OFFER_EVERY_S:
            return False
        if last is None and len(self.last) >= MAX_DOMAINS:
            return True  # relayed, not remembered
        if last is not None and last[0] != key and last[2] != master and now - last[1] < 2.0:
            self.disagree += 1
        self.last[domain] = (key, now, master)
        return True
