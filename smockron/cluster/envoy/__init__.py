"""The Envoy rate limit service front: envoyproxy/ratelimit's YAML config over a RateLimiter.

``add_to_server(server, limiter, load_config([...]))`` serves
``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`` on a ``grpc.aio`` server.
Protobuf modules are generated into ``pb/`` by ``generate.sh``.
"""

from __future__ import annotations

from smockron.cluster.envoy.config import EnvoyConfig, Limit, Match, load_config, parse_domain
from smockron.cluster.envoy.reload import ConfigReloader
from smockron.cluster.envoy.service import RateLimitServicer, add_to_server
from smockron.cluster.envoy.settings import EnvoySettings
from smockron.cluster.envoy.stats import EnvoyStats, EnvoyStatsCollector, LimitStats

__all__ = [
    "ConfigReloader",
    "EnvoyConfig",
    "EnvoySettings",
    "EnvoyStats",
    "EnvoyStatsCollector",
    "Limit",
    "LimitStats",
    "Match",
    "RateLimitServicer",
    "add_to_server",
    "load_config",
    "parse_domain",
]
