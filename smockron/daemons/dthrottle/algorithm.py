"""DThrottle's algorithm: a leaky bucket per tag that peers' reports drain too.

Pure: no I/O; every method takes ``now`` in seconds. One :class:`Throttle` per daemon.

- A new tag starts with a full bucket (``burst`` tokens) that refills at ``rate`` per
  second up to ``burst``. A query is OK while the balance holds a whole token and takes
  it; a NO costs nothing.
- OK answers are counted per tag; :meth:`Throttle.take_report` hands those counts over
  for the peers and forgets the buckets that are full again (they would start full
  anyway), looking at ``SWEEP_SLICE`` of them per report, or twice as many as were
  made since the last one if that is more.
- :meth:`Throttle.apply_report` subtracts the hits a peer served, which may drive the
  balance below zero: that is how a client that hit every online pays on every online.
- The table holds at most ``max_entries`` buckets: a bucket leaves only once full again,
  which with a slow refill takes long, so a client sending new tags would grow it
  without end. At the limit the fullest of the oldest buckets are evicted
  (:meth:`Throttle._evict`): a full one answers exactly as its replacement would, and an
  almost full one forgives least.
- The rule of a tag is the one with the longest matching prefix (the default rule has
  the empty prefix); whitelisted prefixes take part in the same longest-prefix match and
  make a tag always OK, with no bucket and no report.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Final

from smockron.core.bucket import RefillBucket
from smockron.errors import ConfigError

OK = b"OK\n"
NO = b"NO\n"

SWEEP_SLICE: Final = 65_536
"""Buckets a report looks at for those full again, unless more were made since the last
report (then twice as many as were made). A report is a pause of the daemon's loop: a
table of a million tags is gone through over 16 short reports rather than in one long
scan every report (docs/benchmarks.md); and a flood of new tags is looked at twice as
fast as it comes, so the table stays bounded by the tags of the last few reports, as
with whole scans. A full bucket kept a little longer answers exactly as the new full
bucket that would replace it."""

DEFAULT_MAX_ENTRIES: Final = 1_000_000
"""Buckets a daemon keeps at most, as a gatekeeper's delay table keeps entries."""
EVICT_SHARE: Final = 64
"""At the limit, 1/64 of ``max_entries`` is evicted at once: a short pause now and then
rather than a scan for every new tag."""


@dataclass(frozen=True, slots=True)
class PrefixRule:
    """Tags starting with ``prefix`` get ``burst`` tokens refilled at ``rate`` per second.

    ``whitelisted`` rules have no bucket: every query is OK.
    """

    prefix: bytes
    burst: int = 10
    rate: float = 1.0
    whitelisted: bool = False

    def __post_init__(self) -> None:
        if self.whitelisted:
            return
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise ConfigError(f"burst for prefix {self.prefix!r} must be >= 1, got {self.burst!r}")
        if not self.rate > 0:
            raise ConfigError(f"rate for prefix {self.prefix!r} must be > 0, got {self.rate!r}")


def whitelist(prefix: bytes) -> PrefixRule:
    return PrefixRule(prefix, whitelisted=True)


class RuleTable:
    """Longest-prefix lookup over a handful of rules (a linear scan, longest first)."""

    def __init__(self, default: PrefixRule, rules: Iterable[PrefixRule] = ()) -> None:
        if default.prefix != b"":
            raise ConfigError(f"the default rule has the empty prefix, got {default.prefix!r}")
        by_prefix: dict[bytes, PrefixRule] = {b"": default}
        for rule in rules:
            if rule.prefix in by_prefix and rule.prefix != b"":
                raise ConfigError(f"prefix {rule.prefix!r} is configured twice")
            by_prefix[rule.prefix] = rule
        self.default = by_prefix[b""]
        self._rules = sorted(by_prefix.values(), key=lambda r: len(r.prefix), reverse=True)

    @property
    def rules(self) -> list[PrefixRule]:
        return list(self._rules)

    def rule_for(self, tag: bytes) -> PrefixRule:
        for rule in self._rules:
            if tag.startswith(rule.prefix):
                return rule
        return self.default  # pragma: no cover - the empty prefix always matches


class Throttle:
    """The bucket table of one daemon, with the hits it owes its peers."""

    def __init__(self, rules: RuleTable, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ConfigError(f"max_entries must be >= 1, got {max_entries}")
        self.rules = rules
        self.max_entries = max_entries
        self.evicted = 0
        """Buckets evicted at the limit since start (the daemon counts and logs them)."""
        self.buckets: dict[bytes, RefillBucket] = {}
        self.hits: dict[bytes, int] = {}
        # whitelisted tags seen since the last report: skips the prefix scan on repeats
        self._free: set[bytes] = set()
        self._sweep_from = 0  # where in the table the next report looks for full buckets
        self._made = 0  # buckets made since the last report

    def _new_bucket(self, tag: bytes, now: float) -> RefillBucket | None:
        rule = self.rules.rule_for(tag)
        if rule.whitelisted:
            self._free.add(tag)
            return None
        if len(self.buckets) >= self.max_entries:
            self._evict(now)
        bucket = self.buckets[tag] = RefillBucket.full(rule.burst, rule.rate, now)
        self._made += 1
        return bucket

    def _evict(self, now: float) -> None:
        """Make room: among the oldest ``2 * batch`` buckets (the table's order is the
        order they were made), forget the ``batch`` fullest. A full bucket answers as a
        new one would; one nearly full forgives least of a client's debt, and the oldest
        are the tags a flood of new ones has left behind."""
        buckets = self.buckets
        batch = max(1, self.max_entries // EVICT_SHARE)
        oldest = list(islice(buckets.items(), 2 * batch))
        oldest.sort(key=lambda item: item[1].refill(now) / item[1].burst, reverse=True)
        for tag, _ in oldest[:batch]:
            del buckets[tag]
        gone = min(batch, len(oldest))
        self.evicted += gone
        self._sweep_from = max(0, self._sweep_from - gone)

    def reconfigure(self, rules: RuleTable) -> None:
        """Take new rules (SIGHUP); a tag whose rule changed gets a new, full bucket on its
        next query, the others keep theirs (and their debt)."""
        old, self.rules = self.rules, rules
        self._free.clear()
        for tag in [t for t in self.buckets if old.rule_for(t) != rules.rule_for(t)]:
            del self.buckets[tag]

    def allow(self, tag: bytes, now: float) -> bool:
        """Answer one query: True (OK) takes a token, False (NO) costs nothing."""
        bucket = self.buckets.get(tag)
        if bucket is None:
            if tag in self._free:
                return True
            bucket = self._new_bucket(tag, now)
            if bucket is None:
                return True
        if bucket.try_take(now):
            hits = self.hits
            hits[tag] = hits.get(tag, 0) + 1
            return True
        return False

    def answer(self, tags: Iterable[bytes], now: float) -> bytes:
        """The replies to pipelined queries, concatenated: one write per chunk read."""
        allow = self.allow
        return b"".join([OK if allow(tag, now) else NO for tag in tags])

    def take_report(self, now: float) -> dict[bytes, int]:
        """Hand over the hits since the last report and forget the buckets full again."""
        report, self.hits = self.hits, {}
        self._free = set()
        self._forget_full(now)
        return report

    def _forget_full(self, now: float) -> None:
        """Forget the buckets full again among ``SWEEP_SLICE`` of them (or twice as many
        as were made since the last report), in the table's order from where the last
        report stopped (a table that small: all of them).
        Skipping to there walks the table in C; looking each tag up in a large table
        instead costs a cache miss each, far more (docs/benchmarks.md). Entries
        added or forgotten meanwhile only move what a pass sees by a few: what one pass
        misses, the next sees."""
        buckets = self.buckets
        size = max(SWEEP_SLICE, 2 * self._made)
        self._made = 0
        start = self._sweep_from if self._sweep_from < len(buckets) else 0
        look = islice(buckets.items(), start, start + size)
        full = [tag for tag, bucket in look if bucket.is_full(now)]
        for tag in full:
            del buckets[tag]
        self._sweep_from = start + size - len(full)

    def apply_report(self, hits: Mapping[bytes, int], now: float) -> int:
        """Subtract a peer's hits; returns the number of tags charged (whitelist skipped)."""
        charged = 0
        for tag, count in hits.items():
            bucket = self.buckets.get(tag)
            if bucket is None:
                if tag in self._free:
                    continue
                bucket = self._new_bucket(tag, now)
                if bucket is None:
                    continue
            bucket.subtract(now, count)
            charged += 1
        return charged

    def balance(self, tag: bytes, now: float) -> float | None:
        """The tokens ``tag`` has at ``now`` (burst if unseen, None if whitelisted)."""
        bucket = self.buckets.get(tag)
        if bucket is not None:
            return bucket.refill(now)
        rule = self.rules.rule_for(tag)
        return None if rule.whitelisted else float(rule.burst)
