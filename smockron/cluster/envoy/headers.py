"""The ``X-RateLimit-*`` response headers envoyproxy/ratelimit can add (draft RFC 03 shape).

Computed from the descriptor statuses of one answer: the limited status with the least
``limit_remaining`` speaks for the request, as in envoyproxy/ratelimit.
"""

from __future__ import annotations

from collections.abc import Iterable

from smockron.cluster.envoy.pb import rls_pb2

LIMIT, REMAINING, RESET = "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"

_UNIT_SECONDS = {1: 1, 2: 60, 3: 3600, 4: 86_400, 5: 30 * 86_400, 6: 365 * 86_400}
"""Nominal window per ``RateLimit.Unit`` (SECOND=1 .. YEAR=6) for the ``w=`` parameter."""


def rate_limit_headers(
    statuses: Iterable[rls_pb2.RateLimitResponse.DescriptorStatus],
) -> list[tuple[str, str]]:
    """``[(name, value)]`` for the most constraining limited status; empty when none is."""
    limited = [s for s in statuses if s.HasField("current_limit")]
    if not limited:
        return []
    status = min(limited, key=lambda s: s.limit_remaining)
    limit = status.current_limit
    window = _UNIT_SECONDS.get(limit.unit, 0)
    until = status.duration_until_reset
    reset_s = until.seconds + (1 if until.nanos > 0 else 0)
    return [
        (LIMIT, f"{limit.requests_per_unit}, {limit.requests_per_unit};w={window}"),
        (REMAINING, str(status.limit_remaining)),
        (RESET, str(reset_s)),
    ]
