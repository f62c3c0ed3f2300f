"""Pure value types of the cluster API, independent of protobuf.

The gRPC and HTTP adapters convert to and from these; the Envoy front and the Python
client use them too, so no front end depends on another's generated code.
Enum values are Gubernator v2's wire values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final, Protocol

from smockron.core.algorithms import Algorithm, Behavior

__all__ = [
    "MAX_BATCH",
    "Algorithm",
    "Behavior",
    "RateLimitRequest",
    "RateLimitResponse",
    "RateLimiter",
    "Status",
]

MAX_BATCH: Final = 1000
"""Gubernator refuses a GetRateLimits (or GetPeerRateLimits) call with more items."""


class Status(IntEnum):
    UNDER_LIMIT = 0
    OVER_LIMIT = 1


@dataclass(slots=True)
class RateLimitRequest:
    name: str
    unique_key: str
    hits: int = 0
    limit: int = 0
    duration: int = 0
    algorithm: Algorithm = Algorithm.TOKEN_BUCKET
    behavior: Behavior = Behavior.BATCHING
    burst: int = 0
    metadata: dict[str, str] = field(default_factory=dict)
    created_at: int | None = None

    @property
    def hash_key(self) -> str:
        """The key that decides the owner: Gubernator's ``name + "_" + unique_key``."""
        return f"{self.name}_{self.unique_key}"


@dataclass(slots=True)
class RateLimitResponse:
    status: Status = Status.UNDER_LIMIT
    limit: int = 0
    remaining: int = 0
    reset_time: int = 0
    error: str = ""
    metadata: dict[str, str] = field(default_factory=dict)


class RateLimiter(Protocol):
    """What the API fronts (gRPC, HTTP, Envoy) call: a cluster node, local or remote."""

    async def get_rate_limits(
        self, requests: Sequence[RateLimitRequest]
    ) -> list[RateLimitResponse]: ...
