"""The first line: a gatekeeper holds each identifier to its domain's rules itself.

The master's verdicts arrive a reaction time after the requests that caused them, and
a burst from a connection pool is over before then. So a gatekeeper that knows its
domain's rules (from its configuration, or offered by the master) also holds each
identifier to them on its own traffic, with GCRA (one number per identifier and rule):
a burst is admitted up to the rule's burst, the rest is spaced at the rule's rate
(delayed) or rejected. A DELAY_UNTIL ``X`` from the master says the identifier's
allowance is used up until ``X``: from then on the first line admits one request at
``X`` and spaces the next ones by the fastest rule's interval, instead of letting a
whole burst through at ``X``. Pure: callers pass the time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from smockron.core.rules import ALGORITHMS, Rule, parse_rule_spec
from smockron.gatekeeper._table import _NEVER


class Line(NamedTuple):
    """A domain's rules as the first line applies them: GCRA per rule.

    ``tolerances`` say how far ahead of now an identifier's theoretical arrival time may
    be and still admit a request: ``burst - 1`` intervals for the history rule (a cold
    identifier gets exactly ``burst`` at once), ``burst`` intervals for GCRA (whose
    master admits ``burst + 1``, as the original does).
    """

    intervals: tuple[float, ...]
    tolerances: tuple[float, ...]
    fastest: int
    """The rule with the shortest interval: the spacing a DELAY_UNTIL implies."""

    @classmethod
    def of(cls, algorithm: str, rules: Iterable[Rule]) -> Line | None:
        """The line for ``rules`` (None for none: no first line)."""
        unique = tuple(dict.fromkeys(rules))
        if not unique:
            return None
        slack = 0 if algorithm == "gcra" else 1
        intervals = tuple(rule.interval_ms for rule in unique)
        tolerances = tuple((r.burst - slack) * r.interval_ms for r in unique)
        return cls(intervals, tolerances, intervals.index(min(intervals)))


def _ceil_ms(t: float) -> int:
    """A time as the next whole millisecond (a DELAY_UNTIL is never early)."""
    whole = int(t)
    return whole + (whole < t)


def line_admit(
    line: Line, tats: tuple[float, ...] | None, until: float, now: float
) -> tuple[float, tuple[float, ...]]:
    """When a request may pass the first line of a multi-rule domain, and the arrival
    times once it has. ``until`` is the master's DELAY_UNTIL in force (0 for none), ``now``
    the request's time. Pure; one-rule domains take an inlined copy in ``Decider``.
    Twin of smockron.core.gcra.gcra_update, per rule (``tat = V + tol``)."""
    intervals, tolerances = line.intervals, line.tolerances
    current = list(tats) if tats is not None else [_NEVER] * len(intervals)
    if until > now:  # the fastest rule is used up until then
        k = line.fastest
        current[k] = max(current[k], until + tolerances[k])
    at = now
    for tat, tol in zip(current, tolerances, strict=True):
        at = max(at, tat - tol)
    return at, tuple(max(tat, at) + i for tat, i in zip(current, intervals, strict=True))


RuleConfig = Mapping[str, Iterable[Rule | str]] | Iterable[str]
"""A gatekeeper's own rules: ``{"api": ["10/s:20"]}`` (or Rule objects), or master-style
specs ``["api:10/s:20"]``; an algorithm is given as ``{"api": ["gcra", "10/s:20"]}``."""


def first_lines(rules: RuleConfig) -> dict[bytes, Line | None]:
    """Each domain's first line from a gatekeeper's own rule configuration."""
    by_domain: dict[str, list[Rule]] = {}
    algorithms: dict[str, str] = {}
    items: Iterable[tuple[str, Iterable[Rule | str]]]
    if isinstance(rules, Mapping):
        items = rules.items()
    else:
        items = []
        for text in rules:
            domain, rule = parse_rule_spec(text)
            by_domain.setdefault(domain, []).append(rule)
    for domain, specs in items:
        for spec in specs:
            if isinstance(spec, Rule):
                by_domain.setdefault(domain, []).append(spec)
            elif spec in ALGORITHMS:
                algorithms[domain] = spec
            else:
                by_domain.setdefault(domain, []).append(parse_rule_spec(f"{domain}:{spec}")[1])
    return {d.encode(): Line.of(algorithms.get(d, "history"), rs) for d, rs in by_domain.items()}


def describe_line(line: Line | None) -> str:
    if line is None:
        return "none"
    return ", ".join(
        f"{1000.0 / i:g}/s, {t / i:g} ahead"
        for i, t in zip(line.intervals, line.tolerances, strict=True)
    )
