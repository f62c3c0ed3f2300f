"""``redis://HOST:PORT/DB?layout=original``: GCRA states kept exactly as the original
Smockron master keeps them, so that it and smockron can share one Redis (a migration).

The original master's datastore keeps, per domain and identifier, one string key::

    throttle;<domain>;<identifier>   "1700000000333"   (decimal milliseconds)

the time the identifier's next request is allowed, and updates it with one Lua script
per accounting message (``t = max(ts, now)``, ``I`` the interval, ``B`` the burst in ms)::

    new = (prev and prev >= t - B) and prev + I or t - B + I
    SET key new; PEXPIREAT key t + B

That is smockron's GCRA (``smockron.core.gcra``) with ``V = new``. This store keeps that
layout, and so that both masters see each other's updates:

* before every batch it reads from Redis every key the batch touches (after waiting for
  its own previous write), so decisions start from what both masters have recorded;
* after every batch it writes, in one script, each update as the original's own
  formula with the floor ``t - B`` the engine used: applied to whatever Redis holds by
  then, updates of the two masters in between are merged, not overwritten. (Values only
  grow, so where the engine's update did not use the floor, Redis's value, at least the
  engine's, is the one the original's formula picks as well.)
* each key's expiry is set as the original sets it, ``t + B`` with ``t = max(ts, now)``:
  the engine passes each update's ``t`` to ``put`` (GCRA is computed in one place; this
  store replays the step, it does not work it out again from the state).

The value is written by Redis's Lua (``SET key <number>``), so it reads as the original
writes it. Only GCRA domains of one rule can be kept so (one value per identifier).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable

from smockron.errors import ConfigError
from smockron.master.stores.base import Scope, State, Table, expires_at
from smockron.master.stores.memory import MemoryTable
from smockron.master.stores.redis import _LEN, RedisStore, RedisTable

KEY_PREFIX = b"throttle;"

_WRITE_LUA = """
local blob, pos, n = ARGV[1], 1, 0
while pos <= #blob do
  local key, floor, interval, expire
  key, floor, interval, expire, pos = struct.unpack('>I4c0ddd', blob, pos)
  local prev = tonumber(redis.call('get', key))
  local new
  if prev and prev >= floor then
    new = prev + interval
  else
    new = floor + interval
  end
  redis.call('set', key, new)
  redis.call('pexpireat', key, expire)
  n = n + 1
end
return n
"""
"""Twin of smockron.core.gcra.gcra_update, in Redis's Lua, given the floor ``t - B`` the
engine used: the original master's own update, merged with its writes."""

_OP = struct.Struct(">ddd").pack


def original_key(domain: str, identifier: bytes) -> bytes:
    """The original's key: ``throttle;<domain>;<identifier>``, the identifier read as
    UTF-8 the way Node's ``Buffer.toString`` reads it (invalid bytes become U+FFFD)."""
    text = identifier.decode("utf-8", "replace")
    return KEY_PREFIX + f"{domain};{text}".encode()


def check_scope(scope: Scope) -> None:
    """The original layout holds one GCRA value per identifier of a domain."""
    if scope.algorithm != "gcra":
        raise ConfigError(
            f"domain {scope.domain!r} runs {scope.algorithm!r}, but the store's original "
            "layout keeps GCRA states only (the algorithm of the original Smockron master)"
        )


class OriginalTable(RedisTable):
    """A memory table that records each GCRA update as the original's script applies it."""

    __slots__ = ("domain", "interval", "now_ms", "ops", "tolerance")

    def __init__(self, scope: Scope) -> None:
        check_scope(scope)
        super().__init__(KEY_PREFIX, scope)
        self.domain = scope.domain
        self.interval = scope.rule.interval_ms
        self.tolerance = scope.rule.burst * self.interval  # B, as smockron.core.gcra has it
        self.now_ms = 0.0
        self.ops: list[bytes] = []
        """Write-script records of the updates since the last flush, in order."""

    def put(self, key: bytes, state: State, at: float | None = None) -> None:
        """Record the engine's GCRA step at ``at`` (its ``t``) as the original's script
        takes it: the floor ``t - B``, and the expiry ``max(t, now) + B`` (the original's
        ``t`` is ``max(ts, now)``; the engine's is the message's own time when it came
        late). A state made elsewhere (``at`` None: a peer's) is written as the larger
        of it and Redis's value, expiring when it can throttle nothing."""
        MemoryTable.put(self, key, state)
        name = original_key(self.domain, key)
        if at is None:
            op = _OP(state[0], 0.0, math.ceil(state[0] + self.tolerance))
        else:
            t = at if at > self.now_ms else self.now_ms
            op = _OP(at - self.tolerance, self.interval, math.ceil(t + self.tolerance))
        self.ops.append(_LEN(len(name)) + name + op)

    def forget(self, key: bytes) -> None:
        self.current.pop(key, None)
        self.previous.pop(key, None)
        self.lasting.pop(key, None)

    def tick(self, now_ms: float) -> None:
        self.now_ms = now_ms
        super().tick(now_ms)


class OriginalLayoutStore(RedisStore):
    """Redis in the original master's layout; see the module docstring."""

    layout = "original"
    write_lua = _WRITE_LUA

    def __init__(self, url: str) -> None:
        super().__init__(url, key_prefix=KEY_PREFIX, flush_interval_ms=0.0)

    def _new_table(self, scope: Scope) -> OriginalTable:
        return OriginalTable(scope)

    async def _load(self, touched: Iterable[tuple[Table, bytes]]) -> int:
        """Read every key the batch touches, once our own last write has landed."""
        await self.drain()
        wanted: dict[bytes, tuple[OriginalTable, bytes]] = {}
        for table, ident in touched:
            assert isinstance(table, OriginalTable)
            wanted[original_key(table.domain, ident)] = (table, ident)
        if not wanted:
            return 0
        values = await self._read(wanted)
        for (table, ident), raw in zip(wanted.values(), values, strict=True):
            state = parse_value(raw)
            if state is None:  # never set, or expired as the original expires it
                table.forget(ident)
                continue
            MemoryTable.put(table, ident, state)
            if state[0] > table.keep_after_ms:
                table.keep(ident, state, expires_at(state, table.scope))
        return len(wanted)

    async def live(self, scope: Scope, limit: int) -> list[tuple[bytes, State]]:
        """Memory's values, then those under ``throttle;<domain>;`` in Redis."""
        await self.drain()  # our own last write first
        prefix = KEY_PREFIX + f"{scope.domain};".encode()
        return await self._live(self.tables.get(scope), prefix, limit, parse_value)

    def _records(self, now: float, changed: dict[RedisTable, dict[bytes, State]]) -> list[bytes]:
        """The original's updates, in order (``changed`` is what they produced)."""
        records: list[bytes] = []
        for table in self.tables.values():
            if isinstance(table, OriginalTable):
                records += table.ops
                table.ops.clear()
        return records


def parse_value(raw: bytes | None) -> State | None:
    """A stored value as the original's ``tonumber`` reads it; None for none or junk."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return (value,) if math.isfinite(value) else None
