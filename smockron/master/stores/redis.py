"""``redis://HOST:PORT/DB``: states in Redis, so a restarted master keeps enforcing.

No round trip per message: for each batch the master asks ``load`` for every state the
batch touches (one MGET), applies the rules in Python against that snapshot, then
``flush`` writes every changed state back in one pipeline, each key with a TTL equal to
the time after which it can no longer throttle anything (its window). The rule logic
stays in one place (smockron.core); Redis only stores bytes.

A domain is owned by exactly one master (the router guarantees it when there are
several), so this read-modify-write per batch has no concurrent writer to race with.
States are packed float64 arrays: ``history:api:10.0:20:<identifier>`` -> timestamps.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from typing import Any

import redis.asyncio as aioredis

from smockron.errors import ConfigError
from smockron.master.stores.base import Scope, State, Table

KEY_PREFIX = b"smockron:"


class RedisTable:
    """The states of one scope for the batch in progress, plus what changed."""

    __slots__ = ("cache", "dirty", "prefix")

    def __init__(self, prefix: bytes) -> None:
        self.prefix = prefix
        self.cache: dict[bytes, State] = {}
        self.dirty: dict[bytes, tuple[State, float]] = {}

    def get(self, key: bytes) -> State | None:
        return self.cache.get(key)

    def put(self, key: bytes, state: State, expires_ms: float) -> None:
        self.cache[key] = state
        self.dirty[key] = (state, expires_ms)


class RedisStore:
    """Batched Redis persistence; see the module docstring."""

    scheme = "redis"

    def __init__(self, url: str, *, key_prefix: bytes = KEY_PREFIX) -> None:
        try:
            self.client: aioredis.Redis = aioredis.Redis.from_url(url)
        except ValueError as exc:
            raise ConfigError(f"bad redis URI {url!r}: {exc}") from None
        self.url = url
        self.key_prefix = key_prefix
        self.tables: dict[Scope, RedisTable] = {}
        self.now_ms = 0.0

    def table(self, scope: Scope) -> RedisTable:
        table = self.tables.get(scope)
        if table is None:
            table = self.tables[scope] = RedisTable(self.key_prefix + scope.key_prefix)
        return table

    def retain(self, scopes: set[Scope]) -> None:
        for scope in list(self.tables):
            if scope not in scopes:
                del self.tables[scope]

    def tick(self, now_ms: float) -> None:
        self.now_ms = now_ms

    async def load(self, touched: Iterable[tuple[Table, bytes]]) -> None:
        """Fetch every state a batch touches, in one MGET."""
        for own in self.tables.values():
            own.cache.clear()
        wanted: dict[bytes, tuple[RedisTable, bytes]] = {}
        for table, ident in touched:
            assert isinstance(table, RedisTable)
            wanted[table.prefix + ident] = (table, ident)
        if not wanted:
            return
        keys = list(wanted)
        values: list[Any] = await self.client.mget(keys)
        for key, raw in zip(keys, values, strict=True):
            if raw:
                table, ident = wanted[key]
                table.cache[ident] = _unpack(raw)

    async def flush(self) -> int:
        """Write every changed state back with its TTL, in one pipeline; how many."""
        pipe = self.client.pipeline(transaction=False)
        count = 0
        now = self.now_ms
        for table in self.tables.values():
            for ident, (state, expires) in table.dirty.items():
                ttl = math.ceil(expires - now)
                if ttl > 0:
                    pipe.set(table.prefix + ident, array("d", state).tobytes(), px=ttl)
                else:
                    pipe.delete(table.prefix + ident)
                count += 1
            table.dirty.clear()
            table.cache.clear()
        if count:
            await pipe.execute()
        return count

    def discard(self) -> None:
        """Forget a batch that could not be loaded or written (Redis unreachable)."""
        for table in self.tables.values():
            table.dirty.clear()
            table.cache.clear()

    async def ping(self) -> bool:
        return bool(await self.client.ping())

    async def close(self) -> None:
        await self.client.aclose()


def _unpack(raw: bytes) -> State:
    values = array("d")
    if len(raw) % values.itemsize == 0:
        values.frombytes(raw)
    return values.tolist()
