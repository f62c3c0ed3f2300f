"""The Gubernator-compatible cluster: gRPC and HTTP APIs, ring, batching, GLOBAL, discovery.

What a user imports is the client (:class:`Client`, :class:`AsyncClient`) and the types it
speaks; the server is started by ``smockron cluster`` (:mod:`smockron.cluster.node`).
"""

from __future__ import annotations

from smockron.cluster.client import (
    HOUR,
    MAX_BATCH_SIZE,
    MILLISECOND,
    MINUTE,
    SECOND,
    Algorithm,
    AsyncClient,
    Behavior,
    Client,
    ClientError,
    ClientTimeout,
    ClientUnavailable,
    HealthCheck,
    ItemError,
    RateLimitRequest,
    RateLimitResponse,
    Status,
    grpc_target,
)

__all__ = [
    "HOUR",
    "MAX_BATCH_SIZE",
    "MILLISECOND",
    "MINUTE",
    "SECOND",
    "Algorithm",
    "AsyncClient",
    "Behavior",
    "Client",
    "ClientError",
    "ClientTimeout",
    "ClientUnavailable",
    "HealthCheck",
    "ItemError",
    "RateLimitRequest",
    "RateLimitResponse",
    "Status",
    "grpc_target",
]
