"""Identifiers sharded over a fleet of masters: which master holds which identifier.

A gatekeeper that follows a fleet publishes each accounting message on a *shard topic*,
``\\0#`` + one byte (the identifier's shard) + the domain's topic, instead of the
domain's topic alone. Each master of the fleet subscribes to the shard prefixes it owns,
so ZeroMQ's own subscription filtering (done in the gatekeeper's PUB socket) delivers
every message to exactly the masters that own its shard: sharding and replication cost
the gatekeeper one CRC per message and no socket per master.

Ownership is consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam,
2018): each shard ranks the masters by a consistent-hash ring of their names (the
accounting addresses the fleet knows them by), clockwise from ``shard-s``, and takes the
first ``replicas`` of them that still have room, a master holding at most its fair share
rounded up. A plain ring gives one master of two 34 shards of 64 and the other 30, so the
busier one caps the fleet at 1.88x one master; the bound gives 32 and 32. Every master
computes the same table from the same member list, with no messages exchanged. Adding or
removing a master moves its share of the shards and, through the bound, up to about as
many again (a master that gains shards takes their state from its peers at start, as
every master does). Gatekeepers never need the table: they only connect to every master.

A shard topic starts with a NUL, as the rules offer's topic does, so it never reaches an
original gatekeeper's or master's ``domain\\0`` subscription.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from smockron.core.hashring import HashRing

SHARDS = 64
"""Shards per domain; enough to spread over 32 masters, few enough that a master's
subscriptions and topic table stay small."""
SHARD_PREFIX = b"\0#"


def shard_of(identifier: bytes) -> int:
    """The identifier's shard: the same in every gatekeeper and router (CRC-32)."""
    return zlib.crc32(identifier) & (SHARDS - 1)


def shard_topic(shard: int, domain_topic: bytes) -> bytes:
    """The topic of a domain's message for ``shard`` (``domain_topic`` is ``domain\\0``)."""
    return SHARD_PREFIX + bytes((shard,)) + domain_topic


def shard_topics(domain_topic: bytes) -> tuple[bytes, ...]:
    """Every shard's topic of a domain, indexed by shard."""
    return tuple(shard_topic(shard, domain_topic) for shard in range(SHARDS))


def shard_prefix(shard: int) -> bytes:
    """What a master subscribes to for ``shard``: that shard of every domain."""
    return SHARD_PREFIX + bytes((shard,))


def is_shard_topic(frame: bytes) -> bool:
    return len(frame) > 3 and frame[:2] == SHARD_PREFIX


def owners(members: Iterable[str], replicas: int) -> dict[int, tuple[str, ...]]:
    """Each shard's owners: ``replicas`` distinct members (all of them if fewer), a
    member holding ``ceil(SHARDS * replicas / members)`` shards, or a few more when the
    last shards find their preferred members full."""
    ring = HashRing(members)
    count = min(replicas, len(ring))
    if count == 0:
        return {shard: () for shard in range(SHARDS)}
    cap = -(-SHARDS * count // len(ring))
    load = dict.fromkeys(ring.nodes, 0)
    table: dict[int, tuple[str, ...]] = {}
    for shard in range(SHARDS):
        # the ring's order is the preference; the cap only skips a member already full.
        # The last shards may find fewer than ``count`` members with room: they take the
        # next preferred ones anyway (one over the cap), never the same member twice.
        ranked = ring.successors(f"shard-{shard}", len(ring))
        roomy = [name for name in ranked if load[name] < cap][:count]
        chosen = tuple(roomy + [n for n in ranked if n not in roomy][: count - len(roomy)])
        for name in chosen:
            load[name] += 1
        table[shard] = chosen
    return table


def owned(me: str, members: Iterable[str], replicas: int) -> frozenset[int]:
    """The shards ``me`` holds in a fleet of ``members`` (``me`` among them)."""
    everyone = {me, *members}
    return frozenset(s for s, names in owners(everyone, replicas).items() if me in names)


def encode_shards(shards: Iterable[int]) -> bytes:
    """A set of shards as an 8-byte bitmap (a sync request names the shards it wants)."""
    mask = 0
    for shard in shards:
        mask |= 1 << shard
    return mask.to_bytes(SHARDS // 8, "big")


def decode_shards(frame: bytes) -> frozenset[int]:
    """The inverse of :func:`encode_shards`; ValueError for a frame of the wrong size."""
    if len(frame) != SHARDS // 8:
        raise ValueError(f"a shard set is {SHARDS // 8} bytes, got {len(frame)}")
    mask = int.from_bytes(frame, "big")
    return frozenset(s for s in range(SHARDS) if mask >> s & 1)
