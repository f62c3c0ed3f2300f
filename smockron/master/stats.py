"""Statistics of the master: plain integer counters, read by the log line and Prometheus.

Counters are bumped on the hot path, so they are slot attributes (no dict, no lock);
the Prometheus collector reads them at scrape time from its own thread, which the GIL
makes safe for ints.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from smockron.counters import CounterSet


@dataclass(slots=True)
class DomainStats(CounterSet):
    """What happened to one configured domain's accounting messages."""

    accepted: int = 0
    delayed: int = 0
    rejected: int = 0
    malformed: int = 0
    dropped: int = 0
    published: int = 0
    """DELAY_UNTIL messages published."""
    skewed: int = 0
    """Messages whose timestamp was replaced by the master's clock (see docs/master.md)."""
    late: int = 0
    """Backlog a reconnecting gatekeeper had queued, too old to charge (docs/master.md)."""


@dataclass(slots=True)
class Stats:
    """All counters of one master. Domains are only the configured ones (bounded)."""

    domains: dict[str, DomainStats] = field(default_factory=dict)
    malformed: Counter[str] = field(default_factory=Counter)
    """Malformed messages by reason (``ProtocolError.reason``), whatever their domain."""
    unknown_domain: int = 0
    """Well-formed messages for a domain without rules: counted and ignored."""
    dropped: int = 0
    """Messages dropped because the master's bounded queue was full."""
    batches: int = 0
    """Batches processed; messages / batches is the mean batch size."""
    auth_denied: int = 0
    """CURVE handshakes the allow-list refused (a key that is not a known gatekeeper's)."""
    peer_returns: int = 0
    """Fleet peers heard again after a silence (a partition healed, a peer restarted):
    each one is asked for this master's shards' states."""

    def domain(self, name: str) -> DomainStats:
        """The counters of ``name``, created on first use; kept across rule reloads."""
        stats = self.domains.get(name)
        if stats is None:
            stats = self.domains[name] = DomainStats()
        return stats

    def total(self, counter: str) -> int:
        return sum(getattr(s, counter) for s in self.domains.values())

    def fields(self) -> dict[str, int]:
        """The statistics line's fields: totals, then each domain's non-zero counters
        as ``DOMAIN.COUNTER``."""
        out = {
            "accepted": self.total("accepted"),
            "delayed": self.total("delayed"),
            "rejected": self.total("rejected"),
            "published": self.total("published"),
            "malformed": sum(self.malformed.values()),
            "unknown_domain": self.unknown_domain,
            "dropped": self.dropped,
            "skewed": self.total("skewed"),
            "late": self.total("late"),
            "batches": self.batches,
        }
        for name, s in sorted(self.domains.items()):
            out.update({f"{name}.{k}": v for k, v in s.as_dict().items() if v})
        return out

    def summary(self) -> str:
        """The fields as one logfmt text."""
        return " ".join(f"{k}={v}" for k, v in self.fields().items())
