"""Consistent hashing: which node owns a key.

The design is Gubernator's ``ReplicatedConsistentHash`` (``replicated_hash.go``):

* every node is placed ``replicas`` times (default 512, Gubernator's ``DefaultReplicas``);
  replica ``i`` of node ``n`` sits at ``hash(str(i) + md5_hex(n))``;
* a key sits at ``hash(key)``; its owner is the first replica at or after that point
  (binary search), wrapping to the first replica past the end of the ring.

``hash`` is 64-bit FNV-1a followed by MurmurHash3's 64-bit finaliser (``fmix64``) by
default. Bare FNV-1a (Gubernator's ``GUBER_PEER_PICKER_HASH`` default, ``hash="fnv1a"``)
leaves keys that differ only in their last bytes (``t_load-0`` ... ``t_load-199``) close
together on the ring, so one node could own none of 200 such keys; the finaliser spreads
every input bit over all 64 bits. Ring positions only have to agree between smockron
nodes, so this departs from Gubernator at no cost to compatibility. Plain FNV-1
(Gubernator's in-code default when no picker is configured) is available as
``hash="fnv1"``; it spreads such keys worse still, because its last step is an xor that
never reaches the high bits. Gubernator names nodes by address; smockron hashes whatever
node names its caller uses (the gRPC address). Equal points (vanishingly rare) are
ordered by node name so every process agrees.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Callable, Iterable
from functools import lru_cache

DEFAULT_REPLICAS = 512

_FNV64_OFFSET = 0xCBF29CE484222325
_FNV64_PRIME = 0x100000001B3
_MASK64 = 0xFFFFFFFFFFFFFFFF


def fnv1_64(data: bytes) -> int:
    """64-bit FNV-1: multiply by the prime, then xor the byte."""
    h = _FNV64_OFFSET
    for byte in data:
        h = ((h * _FNV64_PRIME) & _MASK64) ^ byte
    return h


def fnv1a_64(data: bytes) -> int:
    """64-bit FNV-1a: xor the byte, then multiply by the prime."""
    h = _FNV64_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV64_PRIME) & _MASK64
    return h


def fmix64(h: int) -> int:
    """MurmurHash3's 64-bit finaliser: every input bit flips each output bit with p ~ 1/2."""
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & _MASK64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & _MASK64
    return h ^ (h >> 33)


def fnv1a_mix_64(data: bytes) -> int:
    """FNV-1a, then fmix64: the default, evenly spread even for near-identical keys."""
    return fmix64(fnv1a_64(data))


HASHES: dict[str, Callable[[bytes], int]] = {
    "fnv1a-mix": fnv1a_mix_64,
    "fnv1a": fnv1a_64,
    "fnv1": fnv1_64,
}


def _memoised(fn: Callable[[bytes], int]) -> Callable[[str | bytes], int]:
    """Key hashing memoised: the same rate-limit keys come back again and again."""

    @lru_cache(maxsize=1 << 16)
    def key_hash(key: str | bytes) -> int:
        return fn(key.encode("utf-8") if isinstance(key, str) else key)

    return key_hash


_KEY_HASHES = {name: _memoised(fn) for name, fn in HASHES.items()}


class HashRing:
    """Maps keys to nodes so that adding or removing a node moves only ~1/N of the keys."""

    __slots__ = ("_hash", "_hash_name", "_key_hash", "_nodes", "_replicas", "_ring")

    def __init__(
        self,
        nodes: Iterable[str] = (),
        replicas: int = DEFAULT_REPLICAS,
        *,
        hash: str = "fnv1a-mix",
    ) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas!r}")
        if hash not in HASHES:
            raise ValueError(f"unknown hash {hash!r}: choose one of {sorted(HASHES)}")
        self._replicas = replicas
        self._hash_name = hash
        self._hash = HASHES[hash]
        self._key_hash = _KEY_HASHES[hash]
        self._nodes: tuple[str, ...] = ()
        self._ring: tuple[list[int], list[str]] = ([], [])
        self.set_nodes(nodes)

    @property
    def nodes(self) -> tuple[str, ...]:
        """The current nodes, sorted (the order callers passed them in does not matter)."""
        return self._nodes

    @property
    def replicas(self) -> int:
        return self._replicas

    def set_nodes(self, nodes: Iterable[str]) -> None:
        """Replace the node set; the ring is rebuilt and swapped in one step."""
        unique = tuple(sorted(set(nodes)))
        points: list[tuple[int, str]] = []
        for node in unique:
            digest = hashlib.md5(node.encode("utf-8"), usedforsecurity=False).hexdigest()
            points.extend(
                (self._hash(f"{i}{digest}".encode("ascii")), node) for i in range(self._replicas)
            )
        points.sort()
        # One assignment publishes the whole ring: a concurrent owner() (another thread)
        # sees either the old ring or the new one, never hashes of one with owners of another.
        self._ring = ([h for h, _ in points], [n for _, n in points])
        self._nodes = unique

    def owner(self, key: str | bytes) -> str:
        """The node that owns ``key``; LookupError when the ring is empty."""
        hashes, owners = self._ring
        if not hashes:
            raise LookupError("hash ring is empty: no nodes to pick from")
        idx = bisect_left(hashes, self._key_hash(key))
        return owners[idx if idx < len(hashes) else 0]

    def successors(self, key: str | bytes, count: int) -> tuple[str, ...]:
        """The first ``count`` distinct nodes at or after ``key``'s point: its owner,
        then the nodes that take it over when owners leave (replicas of a shard)."""
        hashes, owners = self._ring
        if not hashes:
            raise LookupError("hash ring is empty: no nodes to pick from")
        count = min(count, len(self._nodes))
        idx = bisect_left(hashes, self._key_hash(key))
        found: list[str] = []
        for step in range(len(owners)):
            node = owners[(idx + step) % len(owners)]
            if node not in found:
                found.append(node)
                if len(found) == count:
                    break
        return tuple(found)

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node: object) -> bool:
        return node in self._nodes

    def __repr__(self) -> str:
        nodes = list(self._nodes)
        return f"HashRing({nodes!r}, replicas={self._replicas}, hash={self._hash_name!r})"
