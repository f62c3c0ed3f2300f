"""What an Envoy ShouldRateLimit call asks, resolved against the envoyproxy/ratelimit
configuration before the limiter is asked (pure: the request, the config and ``now``):
each descriptor's match, and the token-bucket request it becomes (see the docstring of
smockron.cluster.envoy.service); and the drains that make refused hits count."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from urllib.parse import quote

from smockron.cluster.envoy.config import UNIT_NAME, EnvoyConfig, Match
from smockron.cluster.envoy.pb import ratelimit_pb2, rls_pb2
from smockron.cluster.model import (
    Algorithm,
    Behavior,
    RateLimitRequest,
    RateLimitResponse,
    Status,
)
from smockron.core import calendar


@dataclass(slots=True)
class Check:
    """One descriptor that goes to the limiter."""

    index: int
    match: Match
    hits: int
    window_end: int
    request: RateLimitRequest


@dataclass(slots=True)
class Plan:
    """What a call asks, resolved against the config before the limiter is asked."""

    request: rls_pb2.RateLimitRequest
    now: int
    known_domain: bool
    unlimited: list[bool]
    checks: list[Check]

    @property
    def batch(self) -> list[RateLimitRequest]:
        return [check.request for check in self.checks]


def match_of(
    config: EnvoyConfig, domain: str, descriptor: ratelimit_pb2.RateLimitDescriptor
) -> Match | None:
    """The configured limit a descriptor falls under (or the override Envoy sent)."""
    entries = [(e.key, e.value) for e in descriptor.entries]
    override = None
    if descriptor.HasField("limit") and descriptor.limit.unit in UNIT_NAME:
        override = (descriptor.limit.requests_per_unit, UNIT_NAME[descriptor.limit.unit])
    return config.lookup(domain, entries, override)


def check_of(
    index: int,
    request: rls_pb2.RateLimitRequest,
    descriptor: ratelimit_pb2.RateLimitDescriptor,
    match: Match,
    now: int,
) -> Check:
    """The limiter request a matched descriptor becomes (see the module docstring)."""
    if descriptor.HasField("hits_addend"):
        hits = descriptor.hits_addend.value
    else:
        hits = max(1, request.hits_addend)
    key = counter_key(descriptor, match.share_patterns)
    duration, gregorian = match.limit.window
    if gregorian:
        _, end = calendar.window(now, duration)
    else:  # aligned to the epoch: the window is part of the key
        start = now - now % duration
        end = start + duration
        key = f"{key}@{start}"
    limiter_request = RateLimitRequest(
        name=f"envoy/{request.domain}",
        unique_key=key,
        hits=hits,
        limit=match.limit.requests_per_unit,
        duration=duration,
        algorithm=Algorithm.TOKEN_BUCKET,
        behavior=Behavior.DURATION_IS_GREGORIAN if gregorian else Behavior.BATCHING,
        created_at=now,
    )
    return Check(index, match, hits, end, limiter_request)


def drains_of(plan: Plan, answers: list[RateLimitResponse]) -> list[RateLimitRequest]:
    """Checks that empty the windows a refused request left room in (its refused hits
    count, as upstream's counter counts them)."""
    drains = []
    for check, answer in zip(plan.checks, answers, strict=True):
        if answer.status == Status.OVER_LIMIT and answer.remaining > 0 and not answer.error:
            drains.append(
                dataclasses.replace(
                    check.request,
                    hits=answer.remaining,
                    behavior=check.request.behavior | Behavior.DRAIN_OVER_LIMIT,
                    metadata={},
                )
            )
    return drains


def counter_key(descriptor: ratelimit_pb2.RateLimitDescriptor, patterns: tuple[str, ...]) -> str:
    """``k1=v1&k2=v2``, URL-escaped; a ``share_threshold`` pattern stands for its values."""
    parts = []
    for j, entry in enumerate(descriptor.entries):
        value = patterns[j] if patterns and patterns[j] else entry.value
        parts.append(f"{quote(entry.key, safe='')}={quote(value, safe='')}")
    return "&".join(parts) or "-"
