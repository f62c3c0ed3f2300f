"""The rate limit response headers envoyproxy/ratelimit adds (``LIMIT_RESPONSE_HEADERS_ENABLED``).

Three headers, plain numbers, named ``RateLimit-Limit``, ``RateLimit-Remaining`` and
``RateLimit-Reset`` unless ``LIMIT_LIMIT_HEADER``, ``LIMIT_REMAINING_HEADER`` and
``LIMIT_RESET_HEADER`` rename them. One descriptor speaks for the answer, chosen as upstream
chooses: the last descriptor that made the answer OVER_LIMIT, else the limited descriptor
with the least ``limit_remaining`` (the first of equals).
"""

from __future__ import annotations

from collections.abc import Sequence

from smockron.cluster.envoy.pb import rls_pb2
from smockron.cluster.envoy.settings import EnvoySettings


def speaking_status(
    statuses: Sequence[rls_pb2.RateLimitResponse.DescriptorStatus], refusing: Sequence[bool]
) -> int | None:
    """Index of the status the headers describe; ``refusing[i]``: status i is OVER_LIMIT
    and counts against the answer (not a quota)."""
    chosen: int | None = None
    least = 2**32 - 1
    for i, status in enumerate(statuses):
        if status.HasField("current_limit") and status.limit_remaining < least:
            chosen, least = i, status.limit_remaining
        if refusing[i]:
            chosen, least = i, 0
    return chosen


def rate_limit_headers(
    status: rls_pb2.RateLimitResponse.DescriptorStatus, reset_s: int, settings: EnvoySettings
) -> list[tuple[str, str]]:
    """``[(name, value)]`` describing ``status``; ``reset_s``: seconds to its window end."""
    return [
        (settings.limit_header, str(status.current_limit.requests_per_unit)),
        (settings.remaining_header, str(status.limit_remaining)),
        (settings.reset_header, str(reset_s)),
    ]
