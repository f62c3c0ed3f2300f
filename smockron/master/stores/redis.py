"""``redis://HOST:PORT/DB``: states persisted in Redis, so a restarted master keeps enforcing.

A domain is owned by exactly one master (the router guarantees it when there are
several), so the master's own memory is the authority and Redis is its durable copy:

* each table keeps its states in memory exactly like ``memory://`` (two generations,
  forgotten after idling longer than the window);
* before a batch is applied, ``load`` fetches from Redis, in one command, only the
  states the batch needs and memory lacks (after a restart: all of them; in steady
  state: new identifiers only);
* after a batch (at most every ``flush_interval_ms``, default 250 ms, when busy; at
  once when idle), ``flush`` writes every changed state in one command, each key with a
  TTL equal to the time after which it can no longer throttle anything (its window).
  The write runs while the next batches are decoded and applied (write-behind, at most
  one write in flight, so writes reach Redis in order). A master killed outright loses
  at most the last interval's updates: it then under-counts, never over-throttles.

No round trip per message, and the rule logic stays in one place (smockron.core).
States are packed float64 arrays under ``smockron:history:api:10.0:20:<identifier>``.
When Redis is unreachable the master goes on from memory and logs; nothing is dropped.
A URI that cannot name a Redis (``redis://tcp://h:p``, a port that is not a number) is
refused when the store is made, with the URI in the message.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import struct
import time
from array import array
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, ClassVar

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from smockron.errors import ConfigError
from smockron.master.stores.base import Scope, State, Table, expires_at
from smockron.master.stores.breaker import Breaker
from smockron.master.stores.memory import MemoryTable, TableSet, memory_states, scope_expiry
from smockron.master.stores.uri import STORES, StoreURI, parse_store_uri, redacted

KEY_PREFIX = b"smockron:"

TIMEOUT_S = 0.15
"""Every Redis call's deadline: a Redis that stops answering (stopped, a network black
hole) holds the master's processing this long at most, then the breaker opens."""
RETRY_S = 1.0
"""How long the breaker stays open before Redis is tried again."""

_log = logging.getLogger("smockron.master.redis")

# Both scripts take one argument, a blob of length-prefixed records, and unpack it in
# Lua: redis-py packs a command argument by argument in Python, which for thousands of
# keys costs more than everything else the master does. (The keys are therefore not
# declared in KEYS: fine for a standalone Redis, which is what the master supports.)
_READ_LUA = """
local blob, pos, out = ARGV[1], 1, {}
while pos <= #blob do
  local key
  key, pos = struct.unpack('>I4c0', blob, pos)
  out[#out + 1] = redis.call('GET', key)
end
return out
"""

_WRITE_LUA = """
local blob, pos, n = ARGV[1], 1, 0
while pos <= #blob do
  local key, value, ttl
  key, value, ttl, pos = struct.unpack('>I4c0I4c0I8', blob, pos)
  if ttl > 0 then
    redis.call('SET', key, value, 'PX', ttl)
  else
    redis.call('DEL', key)
  end
  n = n + 1
end
return n
"""

_LEN = struct.Struct(">I").pack
_TTL = struct.Struct(">Q").pack
_MAX_TTL_MS = 2**53


class RedisTable(MemoryTable):
    """A memory table that also remembers which states changed since the last flush."""

    __slots__ = ("dirty", "prefix", "scope")

    def __init__(self, prefix: bytes, scope: Scope) -> None:
        super().__init__(scope.rule.window_ms, scope_expiry(scope))
        self.prefix = prefix
        self.scope = scope
        self.dirty: dict[bytes, State] = {}

    def put(self, key: bytes, state: State, at: float | None = None) -> None:
        super().put(key, state)
        self.dirty[key] = state

    def has(self, key: bytes) -> bool:
        return key in self.current or key in self.previous or key in self.lasting


@STORES.register
class RedisStore(TableSet[RedisTable]):
    """Batched Redis persistence; see the module docstring."""

    scheme = "redis"
    schemes: ClassVar[tuple[str, ...]] = ("redis", "rediss", "unix", "redis+sentinel")
    layout = "smockron"
    writes_behind = True
    warm_start = False
    write_lua = _WRITE_LUA

    @classmethod
    def open(cls, uri: StoreURI, snapshot: str | None, snapshot_interval: float) -> RedisStore:
        """``?layout=original`` opens the original master's layout (Redis persists the
        states itself: no snapshot)."""
        if uri.layout == "original":
            from smockron.master.stores.original import OriginalLayoutStore

            return OriginalLayoutStore(uri.client_uri)
        return cls(uri.client_uri)

    def __init__(
        self,
        url: str,
        *,
        key_prefix: bytes = KEY_PREFIX,
        flush_interval_ms: float = 250.0,
        timeout_s: float = TIMEOUT_S,
        retry_s: float = RETRY_S,
    ) -> None:
        parsed = parse_store_uri(url)
        if parsed.scheme == "memory" or parsed.layout not in ("smockron", self.layout):
            raise ConfigError(f"{type(self).__name__} cannot use {url!r}: open it with open_store")
        try:
            self.client: Any = make_client(parsed, timeout_s)
        except ValueError as exc:
            raise ConfigError(f"bad redis URI {redacted(url)!r}: {exc}") from None
        self.url = url
        self.key_prefix = key_prefix
        super().__init__()
        self.now_ms = 0.0
        self._shas: dict[str, str] = {}
        self._writing: asyncio.Task[Any] | None = None
        self.flush_interval_ms = flush_interval_ms
        self._flushed_ms = 0.0
        self.breaker = Breaker(redacted(url), retry_s)

    def _new_table(self, scope: Scope) -> RedisTable:
        return RedisTable(self.key_prefix + scope.key_prefix, scope)

    def tick(self, now_ms: float) -> None:
        self.now_ms = now_ms
        super().tick(now_ms)

    @property
    def down_since(self) -> float | None:
        """When Redis stopped answering (monotonic), or None while it answers."""
        return self.breaker.down_since

    @property
    def errors(self) -> int:
        """Failed (or timed-out) Redis calls so far."""
        return self.breaker.failures

    def available(self) -> bool:
        """False while the breaker is open: Redis failed and the retry time has not come.
        The master then goes on from memory without waiting for a timeout per batch."""
        return self.breaker.allow(time.monotonic())

    def _up(self) -> None:
        down = self.breaker.success(time.monotonic())
        if down is not None:
            dirty = sum(len(table.dirty) for table in self.tables.values())
            _log.warning(
                "store %s reconnected after %.1f s (breaker closed): writing the %d "
                "state(s) changed meanwhile",
                self.breaker.name,
                down,
                dirty,
            )

    def _down(self, exc: BaseException, what: str) -> None:
        self.breaker.failure(time.monotonic(), what, exc)

    async def load(self, touched: Iterable[tuple[Table, bytes]]) -> int:
        """Fetch, in one command, the states a batch needs that memory lacks; how many.
        With Redis failing, none: the batch is decided from memory (fail-permissive)."""
        if not self.available():
            return 0
        try:
            return await self._load(touched)
        except Exception as exc:
            self._down(exc, "read")
            return 0

    async def _load(self, touched: Iterable[tuple[Table, bytes]]) -> int:
        wanted: dict[bytes, tuple[RedisTable, bytes]] = {}
        for table, ident in touched:
            assert isinstance(table, RedisTable)
            if not table.has(ident):
                wanted[table.prefix + ident] = (table, ident)
        if not wanted:
            return 0
        values = await self._read(wanted)
        for (table, ident), raw in zip(wanted.values(), values, strict=True):
            if raw and not table.has(ident):
                state = table.current[ident] = _unpack(raw)
                if state and max(state) > table.keep_after_ms:  # e.g. after a restart
                    table.keep(ident, state, expires_at(state, table.scope))
        return len(wanted)

    async def _read(self, keys: Iterable[bytes]) -> list[Any]:
        """The values of ``keys`` (None where absent), in one command."""
        blob = b"".join([_LEN(len(key)) + key for key in keys])
        values: list[Any] = await self._script("read", _READ_LUA, blob)
        self._up()
        return values

    def due(self, now_ms: float) -> bool:
        """Whether a write is due: busy masters write every ``flush_interval_ms``, so
        the many updates of one busy identifier in that time cost one SET."""
        return now_ms - self._flushed_ms >= self.flush_interval_ms

    async def flush(self, *, wait: bool = True) -> int:
        """Write every changed state with its TTL in one command; how many. A failing
        write is counted and logged here, and its states stay dirty.

        With ``wait=False`` the write runs in the background (the previous one is awaited
        first, so writes stay in order); ``drain`` waits for it."""
        if not self.available():  # what changed stays dirty until Redis is back
            return 0
        # the dirty maps are handed over, not copied: a failed write gives them back
        changed = {table: table.dirty for table in self.tables.values() if table.dirty}
        for table in changed:
            table.dirty = {}
        records = self._records(self.now_ms, changed)
        self._flushed_ms = self.now_ms
        await self.drain()
        if records:
            write = self._write(b"".join(records), changed)
            if wait:
                await write
            else:
                self._writing = asyncio.ensure_future(write)
        return len(records)

    async def _write(self, blob: bytes, changed: dict[RedisTable, dict[bytes, State]]) -> None:
        """One write; if it fails, its states are dirty again (newer ones kept), so they
        are written once Redis answers: what Redis holds catches up with memory."""
        try:
            await self._send(blob)
        except Exception as exc:
            self._down(exc, "write")
            for table, states in changed.items():
                for ident, state in states.items():
                    table.dirty.setdefault(ident, state)
            return
        self._up()

    def _records(self, now: float, changed: dict[RedisTable, dict[bytes, State]]) -> list[bytes]:
        """The write script's records of the ``changed`` states, each with its TTL."""
        records: list[bytes] = []
        for table, states in changed.items():
            prefix = table.prefix
            scope = table.scope
            for ident, state in states.items():
                key = prefix + ident
                value = array("d", state).tobytes()
                ttl = min(max(math.ceil(expires_at(state, scope) - now), 0), _MAX_TTL_MS)
                records.append(_LEN(len(key)) + key + _LEN(len(value)) + value + _TTL(ttl))
        return records

    async def _send(self, blob: bytes) -> None:
        """Write the records of ``blob`` in one command."""
        await self._script("write", self.write_lua, blob)

    async def drain(self) -> None:
        """Wait for the background write, if any; a failure is counted and logged."""
        writing, self._writing = self._writing, None
        if writing is not None:
            try:
                await writing
            except Exception as exc:  # Redis down: memory stays the authority
                self._down(exc, "write")

    async def _script(self, name: str, source: str, blob: bytes) -> Any:
        """EVALSHA, loading the script the first time and again after a Redis restart."""
        sha = self._shas.get(name)
        if sha is not None:
            try:
                return await self.client.evalsha(sha, 0, blob)
            except NoScriptError:
                pass
        sha = self._shas[name] = await self.client.script_load(source)
        return await self.client.evalsha(sha, 0, blob)

    async def ping(self) -> bool:
        return bool(await self.client.ping())

    async def live(self, scope: Scope, limit: int) -> list[tuple[bytes, State]]:
        """Memory's states, then Redis' (a restarted master's memory is empty)."""
        table = self.tables.get(scope)
        prefix = self.key_prefix + scope.key_prefix
        return await self._live(table, prefix, limit, _unpack_or_none)

    async def _live(
        self,
        table: MemoryTable | None,
        prefix: bytes,
        limit: int,
        parse: Callable[[bytes], State | None],
    ) -> list[tuple[bytes, State]]:
        states = dict(memory_states(table, limit)) if table is not None else {}
        if len(states) >= limit or not self.available():
            return list(states.items())[:limit]
        try:
            async for ident, raw in self._scan_values(prefix, limit):
                if ident not in states:
                    state = parse(raw)
                    if state:
                        states[ident] = state
            self._up()
        except Exception as exc:
            self._down(exc, "resync scan")
        return list(states.items())[:limit]

    async def _scan_values(self, prefix: bytes, limit: int) -> AsyncIterator[tuple[bytes, bytes]]:
        """(key without ``prefix``, value) of up to ``limit`` keys under ``prefix``, one
        SCAN and one read per ``SCAN_COUNT`` keys: each call is short (and has the
        client's timeout), so a large keyspace never holds the loop long. Each node of
        ``_scan_nodes`` is walked to its end in turn, as a SCAN walks one node's keys."""
        pattern = re.sub(rb"([*?\[\]\\])", rb"\\\1", prefix) + b"*"
        seen = 0
        for node in await self._scan_nodes():
            cursor = 0
            while seen < limit:
                cursor, keys = await self._scan_page(node, cursor, pattern)
                keys = keys[: limit - seen]
                if keys:
                    seen += len(keys)
                    values = await self._values(keys)
                    for key, raw in zip(keys, values, strict=True):
                        if isinstance(key, bytes) and isinstance(raw, bytes):  # not decoded
                            yield key[len(prefix) :], raw
                if cursor == 0:
                    break

    async def _scan_nodes(self) -> Sequence[Any]:
        """What a listing walks: the one server."""
        return (None,)

    async def _scan_page(self, node: Any, cursor: int, pattern: bytes) -> tuple[int, list[Any]]:
        page: tuple[int, list[Any]] = await self.client.scan(
            cursor, match=pattern, count=SCAN_COUNT
        )
        return page

    async def _values(self, keys: list[Any]) -> list[Any]:
        values: list[Any] = await self.client.mget(keys)
        return values

    async def close(self) -> None:
        try:
            await self.drain()
        finally:
            await self.client.aclose()


def make_client(parsed: StoreURI, timeout_s: float) -> Any:
    """The asyncio client a URI names, every call bounded by ``timeout_s`` (connect,
    read and write): a Sentinel's master (found again after a failover), a Cluster
    (commands routed by slot), or one Redis."""
    bounded: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    auth: dict[str, Any] = {"username": parsed.username, "password": parsed.password}
    if parsed.scheme == "redis+sentinel":
        from redis.asyncio.sentinel import Sentinel

        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            list(parsed.hosts), sentinel_kwargs=dict(bounded), **bounded
        )
        return sentinel.master_for(parsed.service, db=parsed.db, **auth)
    if parsed.scheme == "redis+cluster":
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        nodes = [ClusterNode(host, port) for host, port in parsed.hosts]
        return RedisCluster(startup_nodes=nodes, **auth, **bounded)
    return aioredis.Redis.from_url(parsed.client_uri, **bounded)


_RECORD_HEAD = struct.Struct(">I")
_RECORD_TTL = struct.Struct(">Q")


@STORES.register
class ClusterRedisStore(RedisStore):
    """``redis+cluster://``: the same states and TTLs, written and read with one
    pipeline of single-key GET/SET/DEL per batch instead of one Lua script (a script may
    only touch keys of one slot; identifiers spread over all of them). redis-py's cluster
    pipeline sends each node its commands, so a batch still costs one round trip per
    node, and no key needs a hash tag. RESYNC's listing SCANs every primary in turn."""

    scheme = "redis+cluster"
    schemes: ClassVar[tuple[str, ...]] = ("redis+cluster",)

    async def _read(self, keys: Iterable[bytes]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
        values: list[Any] = await pipe.execute()
        self._up()
        return values

    async def _send(self, blob: bytes) -> None:
        pipe = self.client.pipeline(transaction=False)
        for key, value, ttl in _records_of(blob):
            if ttl > 0:
                pipe.set(key, value, px=ttl)
            else:
                pipe.delete(key)
        await pipe.execute()

    async def _scan_nodes(self) -> Sequence[Any]:
        """Every primary: a SCAN answers for the node it is sent to, so each is walked
        (the nodes as the client last learnt them, learning them first on a fresh
        client; a failover fails the listing, which the next RESYNC repeats)."""
        await self.client.initialize()  # no-op once the slots are known
        primaries: list[Any] = self.client.get_primaries()
        return primaries

    async def _scan_page(self, node: Any, cursor: int, pattern: bytes) -> tuple[int, list[Any]]:
        cursors, keys = await self.client.scan(
            cursor, match=pattern, count=SCAN_COUNT, target_nodes=node
        )
        return int(cursors[node.name]), list(keys)

    async def _values(self, keys: list[Any]) -> list[Any]:
        return await self._read(keys)  # keys of many slots: GETs pipelined to their node


def _records_of(blob: bytes) -> Iterable[tuple[bytes, bytes, int]]:
    """The write script's records, unpacked as its Lua does."""
    pos, end = 0, len(blob)
    while pos < end:
        (size,) = _RECORD_HEAD.unpack_from(blob, pos)
        key = blob[pos + 4 : pos + 4 + size]
        pos += 4 + size
        (size,) = _RECORD_HEAD.unpack_from(blob, pos)
        value = blob[pos + 4 : pos + 4 + size]
        pos += 4 + size
        (ttl,) = _RECORD_TTL.unpack_from(blob, pos)
        pos += 8
        yield key, value, ttl


SCAN_COUNT = 1000
"""Keys asked per SCAN (and read at once) while listing states for a resync."""


def _unpack_or_none(raw: bytes) -> State | None:
    return _unpack(raw) or None


def _unpack(raw: bytes) -> State:
    values = array("d")
    if len(raw) % values.itemsize == 0:
        values.frombytes(raw)
    return tuple(values)
