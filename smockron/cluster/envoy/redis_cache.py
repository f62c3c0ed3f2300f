"""envoyproxy/ratelimit's Redis fixed window (``BACKEND_TYPE=redis``), counts shared with it.

The counters are upstream's, key for key, so that upstream ratelimit processes and smockron
nodes can serve one Envoy fleet from one Redis during a migration, and a restarted node
forgets nothing. One descriptor's counter is (``src/limiter/cache_key.go``)::

    CACHE_KEY_PREFIX + domain + "_" + (key + "_" + value + "_") per entry + window start

the window start in Unix seconds, ``now - now % divider``, the divider 1, 60, 3600, 86400,
604800, 2592000 (30 days) or 31536000 (365 days) for second ... year (so a month or year
here is upstream's, not the calendar's of the cluster backend). A ``share_threshold``
entry's value is its wildcard pattern. Each call sends one pipeline (``src/redis/
fixed_cache_impl.go``): ``INCRBY key hits`` and ``EXPIRE key divider + jitter`` per
descriptor (jitter up to ``EXPIRATION_JITTER_MAX_SECONDS``); with ``REDIS_PERSECOND``,
second limits go to their own Redis. The count after the increment decides: over the limit
is OVER_LIMIT (refused hits count, as upstream's do).

``LOCAL_CACHE_SIZE_IN_BYTES``: keys seen over their limit are remembered here until their
window ends and answered OVER_LIMIT without Redis (``over_limit_with_local_cache``).
``STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT``: the counts are read first (``GET``); when a
request would take some counter over its limit, only those counters are incremented, and
none is when a key is already in the local cache.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from smockron.cluster.envoy.config import Match
from smockron.cluster.envoy.pb import ratelimit_pb2, rls_pb2
from smockron.cluster.envoy.plan import Check, Plan
from smockron.cluster.envoy.redis_pool import PoolStats, count_connections
from smockron.cluster.envoy.service import RateLimitServicer
from smockron.cluster.envoy.upstream_env import RedisSettings, UpstreamSettings
from smockron.cluster.model import RateLimitResponse, Status
from smockron.errors import ConfigError

log = logging.getLogger("smockron.cluster.envoy")

UNIT_DIVIDER: dict[str, int] = {
    "second": 1,
    "minute": 60,
    "hour": 3600,
    "day": 86_400,
    "week": 604_800,
    "month": 2_592_000,
    "year": 31_536_000,
}
"""Upstream's ``UnitToDivider``, in seconds."""


def cache_key(
    prefix: str,
    domain: str,
    entries: Sequence[tuple[str, str]],
    patterns: Sequence[str],
    unit: str,
    now_s: int,
) -> str:
    """Upstream's ``GenerateCacheKey``."""
    parts = [prefix, domain, "_"]
    for i, (key, value) in enumerate(entries):
        shown = patterns[i] if i < len(patterns) and patterns[i] else value
        parts += [key, "_", shown, "_"]
    divider = UNIT_DIVIDER[unit]
    parts.append(str(now_s - now_s % divider))
    return "".join(parts)


class OverLimitCache:
    """Keys known to be over their limit, until their window ends, in at most ``size``
    bytes (upstream's freecache: 512 KiB at least; a key costs its length plus a 24-byte
    header). The oldest entries go first when it is full.

    It counts what freecache counts, for upstream's ``ratelimit.localcache.*`` gauges
    (``gauges()``): lookups that found a live key (hits) or not (misses; a key found
    expired is dropped and counted expired too), entries dropped to make room (evacuated;
    expired ones count as expired), keys set again while present (overwrites), and the
    mean of the entries' last access times (Unix seconds: set, or found)."""

    MIN_SIZE = 512 * 1024
    ENTRY_OVERHEAD = 24

    def __init__(
        self,
        size: int,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.size = max(size, self.MIN_SIZE)
        self._clock = clock
        self._wall = wall
        self._entries: OrderedDict[str, tuple[float, int]] = OrderedDict()
        """key: (expiry on ``clock``, last access in Unix seconds)."""
        self._used = 0
        self._access_total = 0
        self.hits = 0
        self.misses = 0
        self.expired = 0
        self.evacuated = 0
        self.overwrites = 0

    def __contains__(self, key: str) -> bool:
        entry = self._entries.get(key)
        if entry is not None and entry[0] > self._clock():
            self.hits += 1
            self._access(key, entry[0])
            return True
        if entry is not None:
            self._drop(key)
            self.expired += 1
        self.misses += 1
        return False

    def add(self, key: str, ttl_s: float) -> None:
        cost = len(key.encode()) + self.ENTRY_OVERHEAD
        if cost > self.size:
            return
        expires = self._clock() + ttl_s
        if key in self._entries:  # in place, as freecache overwrites
            self.overwrites += 1
            self._access(key, expires)
            return
        while self._used + cost > self.size and self._entries:
            oldest, (until, _) = next(iter(self._entries.items()))
            self._drop(oldest)
            if until > self._clock():
                self.evacuated += 1
            else:
                self.expired += 1
        now = int(self._wall())
        self._entries[key] = (expires, now)
        self._access_total += now
        self._used += cost

    def gauges(self) -> dict[str, int]:
        """freecache's counters under the names upstream gives its gauges, in its order."""
        entries = len(self._entries)
        return {
            "evacuateCount": self.evacuated,
            "expiredCount": self.expired,
            "entryCount": entries,
            "averageAccessTime": self._access_total // entries if entries else 0,
            "hitCount": self.hits,
            "missCount": self.misses,
            "lookupCount": self.hits + self.misses,
            "overwriteCount": self.overwrites,
        }

    def _access(self, key: str, expires: float) -> None:
        now = int(self._wall())
        self._access_total += now - self._entries[key][1]
        self._entries[key] = (expires, now)

    def _drop(self, key: str) -> None:
        _, accessed = self._entries.pop(key)
        self._access_total -= accessed
        self._used -= len(key.encode()) + self.ENTRY_OVERHEAD


def split_auth(auth: str) -> tuple[str | None, str | None]:
    """``user:password`` or a bare password (upstream's ``strings.Cut(auth, ":")``)."""
    if not auth:
        return None, None
    user, sep, password = auth.partition(":")
    return (user, password) if sep else (None, auth)


def _host_port(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"{what}: {text!r} is not host:port")
    return host.strip("[]") or "localhost", int(port)


def make_client(settings: RedisSettings, what: str = "REDIS_URL") -> Any:
    """An asyncio redis-py client for one of upstream's Redis settings (hiredis parses
    the replies when installed)."""
    make = {"single": _single, "sentinel": _sentinel, "cluster": _cluster}.get(settings.type)
    if make is None:
        raise ConfigError(f"REDIS_TYPE {settings.type!r}: use single, sentinel or cluster")
    return make(settings, _common_options(settings), what)


def _common_options(settings: RedisSettings) -> dict[str, Any]:
    """The client options every kind of deployment takes: auth, timeouts, pool, TLS."""
    user, password = split_auth(settings.auth)
    common: dict[str, Any] = {
        "username": user,
        "password": password,
        "socket_timeout": settings.timeout_s,
        "socket_connect_timeout": settings.timeout_s,
        "max_connections": settings.pool_size,
    }
    if settings.tls:
        common.update(
            ssl=True,
            ssl_certfile=settings.tls_client_cert or None,
            ssl_keyfile=settings.tls_client_key or None,
            ssl_ca_certs=settings.tls_cacert or None,
            ssl_check_hostname=not settings.tls_skip_hostname_verification,
            ssl_cert_reqs=ssl.CERT_REQUIRED,
        )
    return common


def _single(settings: RedisSettings, common: dict[str, Any], what: str) -> Any:
    from redis.asyncio import Redis

    if settings.socket_type == "unix":
        common.pop("ssl", None)
        for name in [k for k in common if k.startswith("ssl_")]:
            common.pop(name)
        return Redis(unix_socket_path=settings.url, **common)
    if settings.socket_type != "tcp":
        raise ConfigError(f"{what}: socket type {settings.socket_type!r}: use tcp or unix")
    if settings.url.startswith(("redis://", "rediss://")):
        return Redis.from_url(settings.url, **{k: v for k, v in common.items() if v})
    host, port = _host_port(settings.url, what)
    return Redis(host=host, port=port, **common)


def _sentinel(settings: RedisSettings, common: dict[str, Any], what: str) -> Any:
    from redis.asyncio.sentinel import Sentinel

    parts = [p.strip() for p in settings.url.split(",") if p.strip()]
    if len(parts) < 2:
        raise ConfigError(
            f"{what}: Expected master name and a list of urls for the sentinels, in the "
            "format: <redis master name>,<sentinel1>,...,<sentineln>"
        )
    sentinels = [_host_port(p, what) for p in parts[1:]]
    s_user, s_password = split_auth(settings.sentinel_auth)
    sentinel_kwargs: dict[str, Any] = {"socket_timeout": settings.timeout_s}
    if s_password:
        sentinel_kwargs.update(username=s_user, password=s_password)
    max_connections = common.pop("max_connections")
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        sentinels, sentinel_kwargs=sentinel_kwargs, **common
    )
    return sentinel.master_for(parts[0], max_connections=max_connections)


def _cluster(settings: RedisSettings, common: dict[str, Any], what: str) -> Any:
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    nodes = [ClusterNode(*_host_port(p, what)) for p in settings.url.split(",") if p.strip()]
    if not nodes:
        raise ConfigError(f"{what}: no cluster node address")
    return RedisCluster(startup_nodes=nodes, **common)


@dataclass(slots=True)
class _Key:
    key: str
    per_second: bool
    divider: int


class RedisRateLimitServicer(RateLimitServicer):
    """The Envoy front with upstream's Redis counters instead of the cluster's."""

    fast_path = False

    def __init__(
        self,
        *args: Any,
        upstream: UpstreamSettings,
        client: Any,
        per_second_client: Any | None = None,
        rng: random.Random | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.upstream = upstream
        self.client = client
        self.per_second_client = per_second_client
        # upstream's ratelimit.redis_pool.* (and redis_per_second_pool.*) statsd stats
        self.pool_stats = {"redis_pool": PoolStats()}
        count_connections(client, self.pool_stats["redis_pool"])
        if per_second_client is not None and per_second_client is not client:
            self.pool_stats["redis_per_second_pool"] = PoolStats()
            count_connections(per_second_client, self.pool_stats["redis_per_second_pool"])
        self.local_cache = (
            OverLimitCache(upstream.local_cache_size_in_bytes)
            if upstream.local_cache_size_in_bytes
            else None
        )
        self._rng = rng or random.Random()
        # at most REDIS_POOL_SIZE pipelines at once per Redis: later calls wait for a
        # connection, as upstream's pool makes them wait (redis-py's pool would refuse)
        self._slots = {
            False: asyncio.Semaphore(upstream.redis.pool_size),
            True: asyncio.Semaphore(upstream.redis_persecond_settings.pool_size),
        }

    async def close(self) -> None:
        for client in {id(c): c for c in (self.client, self.per_second_client) if c}.values():
            await client.aclose()

    async def ping(self) -> bool:
        """Whether every Redis answers (the health check's ``redis`` component)."""
        try:
            for per_second, client in ((False, self.client), (True, self.per_second_client)):
                if client is not None:
                    async with self._slots[per_second]:
                        await client.ping()
        except Exception as exc:  # any failure: not healthy yet
            self._log.warning("envoy: redis: %r", exc, key="ping")
            return False
        return True

    @staticmethod
    def _check(
        index: int,
        request: rls_pb2.RateLimitRequest,
        descriptor: ratelimit_pb2.RateLimitDescriptor,
        match: Match,
        now: int,
    ) -> Check:
        check = RateLimitServicer._check(index, request, descriptor, match, now)
        divider_ms = UNIT_DIVIDER[match.limit.unit] * 1000
        now_s_ms = now - now % 1000  # upstream counts in whole seconds
        check.window_end = now_s_ms - now_s_ms % divider_ms + divider_ms
        return check

    def _keys(self, plan: Plan) -> list[_Key]:
        now_s = plan.now // 1000
        keys = []
        for check in plan.checks:
            descriptor = plan.request.descriptors[check.index]
            entries = [(e.key, e.value) for e in descriptor.entries]
            unit = check.match.limit.unit
            key = cache_key(
                self.upstream.cache_key_prefix,
                plan.request.domain,
                entries,
                check.match.share_patterns,
                unit,
                now_s,
            )
            per_second = unit == "second" and self.per_second_client is not None
            keys.append(_Key(key, per_second, UNIT_DIVIDER[unit]))
        return keys

    async def _limit(self, plan: Plan) -> list[RateLimitResponse]:
        checks = plan.checks
        if not checks:
            return []
        keys = self._keys(plan)
        cached = [self.local_cache is not None and k.key in self.local_cache for k in keys]
        any_cached = any(cached)
        near = [False] * len(checks)
        if self.upstream.stop_cache_key_increment_when_overlimit and not any_cached:
            counts = await self._run(keys, [("GET",)] * len(keys), skip=cached)
            for i, check in enumerate(checks):
                after = int(counts[i] or 0) + check.hits
                near[i] = after > check.match.limit.requests_per_unit
        any_near = any(near)
        commands = []
        for i, (check, key) in enumerate(zip(checks, keys, strict=True)):
            expire = key.divider
            if self.upstream.expiration_jitter_max_seconds > 0:
                expire += self._rng.randrange(self.upstream.expiration_jitter_max_seconds)
            hits = self._addend(check.hits, any_cached, any_near, near[i])
            commands.append(("INCRBY", hits, expire))
        results = await self._run(keys, commands, skip=cached)
        answers = []
        for i, (check, key) in enumerate(zip(checks, keys, strict=True)):
            limit = check.match.limit.requests_per_unit
            if cached[i]:
                self._local_cache_hit(check)
                answers.append(RateLimitResponse(Status.OVER_LIMIT, limit, 0))
                continue
            after = int(results[i])
            before = after - check.hits
            if after > limit:
                if self.local_cache is not None:
                    self.local_cache.add(key.key, key.divider)
                answers.append(RateLimitResponse(Status.OVER_LIMIT, limit, max(0, limit - before)))
            else:
                answers.append(RateLimitResponse(Status.UNDER_LIMIT, limit, limit - after))
        return answers

    def _addend(self, hits: int, any_cached: bool, any_near: bool, near: bool) -> int:
        """Upstream's ``getHitsAddend``."""
        if not self.upstream.stop_cache_key_increment_when_overlimit:
            return hits
        if any_cached:
            return 0
        if not any_near or near:
            return hits
        return 0

    def _local_cache_hit(self, check: Check) -> None:
        stats = self._limit_stats(check.match.stats_key)
        stats.over_limit_with_local_cache += check.hits

    async def _run(
        self, keys: list[_Key], commands: Sequence[tuple[Any, ...]], skip: list[bool]
    ) -> list[Any]:
        """One pipeline per Redis; the first reply of each command, in ``keys`` order."""
        out: list[Any] = [None] * len(keys)
        groups: dict[bool, list[int]] = {}
        for i, key in enumerate(keys):
            if not skip[i]:
                groups.setdefault(key.per_second, []).append(i)

        async def send(per_second: bool, indexes: list[int]) -> None:
            client: Any = self.per_second_client if per_second else self.client
            pipe = client.pipeline(transaction=False)
            for i in indexes:
                command = commands[i]
                if command[0] == "GET":
                    pipe.get(keys[i].key)
                else:
                    pipe.incrby(keys[i].key, command[1])
                    pipe.expire(keys[i].key, command[2])
            async with self._slots[per_second]:
                replies = await pipe.execute()
            step = 1 if commands[indexes[0]][0] == "GET" else 2
            for n, i in enumerate(indexes):
                out[i] = replies[n * step]

        await asyncio.gather(*(send(ps, idx) for ps, idx in groups.items()))
        return out


def build_redis_servicer(
    node: Any,
    config: Any,
    upstream: UpstreamSettings,
    **kwargs: Any,
) -> RedisRateLimitServicer:
    """The servicer with its clients (``REDIS_*``, and ``REDIS_PERSECOND_*`` when set)."""
    client = make_client(upstream.redis)
    per_second = None
    if upstream.redis_persecond:
        per_second = make_client(upstream.redis_persecond_settings, "REDIS_PERSECOND_URL")
    return RedisRateLimitServicer(
        node, config, upstream=upstream, client=client, per_second_client=per_second, **kwargs
    )
