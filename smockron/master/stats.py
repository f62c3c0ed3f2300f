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
    auth_denied: int = 0
    """CURVE handshakes the allow-list refused (a key that is not a known gatekeeper's)."""
    """Batches processed; messages / batches is the mean batch size."""

    def domain(self, name: str) -> DomainStats:
        """The counters of ``name``, created on first use; kept across rule reloads."""
        stats = self.domains.get(name)
        if stats is None:
            stats = self.domains[name] = DomainStats()
        return stats

    def total(self, counter: str) -> int:
        return sum(getattr(s, counter) for s in self.domains.values())

    def summary(self) -> str:
        """One log line: totals, then each domain's non-zero counters."""
        parts = [
            f"accepted={self.total('accepted')}",
            f"delayed={self.total('delayed')}",
            f"rejected={self.total('rejected')}",
            f"published={self.total('published')}",
            f"malformed={sum(self.malformed.values())}",
            f"unknown_domain={self.unknown_domain}",
            f"dropped={self.dropped}",
            f"skewed={self.total('skewed')}",
            f"late={self.total('late')}",
            f"batches={self.batches}",
        ]
        for name, s in sorted(self.domains.items()):
            busy = " ".join(f"{k}={v}" for k, v in s.as_dict().items() if v)
            if busy:
                parts.append(f"[{name}: {busy}]")
        return " ".join(parts)
