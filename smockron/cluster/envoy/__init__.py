"""The Envoy rate limit service front: envoyproxy/ratelimit's YAML config over a RateLimiter.

``add_to_server(server, limiter, load_config([...]))`` serves
``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`` on a ``grpc.aio`` server.
Protobuf modules are generated into ``pb/`` by ``generate.sh``.
"""

from __future__ import annotations

from smockron.cluster.envoy.config import EnvoyConfig, Limit, load_config, parse_domain
from smockron.cluster.envoy.reload import ConfigReloader
from smockron.cluster.envoy.service import (
    EnvoyStats,
    EnvoyStatsCollector,
    RateLimitServicer,
    add_to_server,
)

__all__ = [
    "ConfigReloader",
    "EnvoyConfig",
    "EnvoyStats",
    "EnvoyStatsCollector",
    "Limit",
    "RateLimitServicer",
    "add_to_server",
    "load_config",
    "parse_domain",
]
