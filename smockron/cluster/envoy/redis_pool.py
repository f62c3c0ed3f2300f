"""envoyproxy/ratelimit's Redis pool stats: connections opened and closed.

Upstream traces its radix pools (``src/redis/driver_impl.go``, ``poolTrace``): each
connection made counts ``cx_total`` and raises the ``cx_active`` gauge, each one closed
counts ``cx_local_close`` and lowers it, under ``ratelimit.redis_pool.`` (and
``ratelimit.redis_per_second_pool.`` for ``REDIS_PERSECOND_*``). redis-py has no such
trace, so the client's connection class is swapped for a subclass that counts where a
connection is made and closed; the single, Sentinel and Cluster clients keep their own
classes (TLS, Unix socket, Sentinel-managed) underneath.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class PoolStats:
    """One pool's counts, read by the statsd sink and the debug ``/stats``."""

    total: int = 0
    """Connections made (``cx_total``)."""
    closed: int = 0
    """Connections this side closed (``cx_local_close``)."""

    @property
    def active(self) -> int:
        """Connections open now (``cx_active``)."""
        return self.total - self.closed


def _counted(base: type[Any], stats: PoolStats) -> type[Any]:
    """``base`` counting into ``stats``: redis-py connects in ``connect_check_health``
    (``connect`` and a command on a closed connection both call it)."""

    class Counted(base):  # type: ignore[misc, valid-type]
        async def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
            was = self.is_connected
            await super().connect_check_health(*args, **kwargs)
            if not was and self.is_connected:
                stats.total += 1

        async def disconnect(self, *args: Any, **kwargs: Any) -> None:
            was = self.is_connected
            await super().disconnect(*args, **kwargs)
            if was and not self.is_connected:
                stats.closed += 1

    Counted.__name__ = Counted.__qualname__ = f"Counted{base.__name__}"
    return Counted


def count_connections(client: Any, stats: PoolStats) -> None:
    """Count ``client``'s connections into ``stats`` (a redis.asyncio Redis, as made
    for single and Sentinel deployments, or a RedisCluster, before any connection)."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        pool.connection_class = _counted(pool.connection_class, stats)
        return
    manager = client.nodes_manager
    base = manager.connection_kwargs.get("connection_class")
    if base is None:
        from redis.asyncio.connection import Connection

        base = Connection
    counted = _counted(base, stats)
    manager.connection_kwargs["connection_class"] = counted
    for node in [*manager.startup_nodes.values(), *manager.nodes_cache.values()]:
        node.connection_class = counted


def pool_counters(pools: dict[str, PoolStats], suffix: str) -> dict[str, int]:
    """The counters of every pool under upstream's statsd names."""
    out: dict[str, int] = {}
    for scope, stats in pools.items():
        out[f"ratelimit.{scope}.cx_total{suffix}"] = stats.total
        out[f"ratelimit.{scope}.cx_local_close{suffix}"] = stats.closed
    return out


def pool_gauges(pools: dict[str, PoolStats], suffix: str) -> dict[str, int]:
    return {f"ratelimit.{scope}.cx_active{suffix}": s.active for scope, s in pools.items()}
