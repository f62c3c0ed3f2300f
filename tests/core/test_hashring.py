from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smockron.core.hashring import DEFAULT_REPLICAS, HashRing, fmix64, fnv1_64, fnv1a_64

NODES = [f"10.0.0.{i}:1051" for i in range(1, 6)]
KEYS = [f"requests_per_sec_account:{i}" for i in range(20_000)]


def test_fnv1_64_reference_vectors() -> None:
    # Published FNV-1 (not FNV-1a) 64-bit test vectors.
    assert fnv1_64(b"") == 0xCBF29CE484222325
    assert fnv1_64(b"a") == 0xAF63BD4C8601B7BE
    assert fnv1_64(b"foobar") == 0x340D8765A4DDA9C2


def test_fnv1a_64_reference_vectors() -> None:
    assert fnv1a_64(b"") == 0xCBF29CE484222325
    assert fnv1a_64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a_64(b"foobar") == 0x85944171F73967E8


def _brute_owner(nodes: list[str], key: str, replicas: int, fn: Callable[[bytes], int]) -> str:
    """Gubernator's rule spelled out: first replica at or after the key's hash, else wrap."""
    points = []
    for n in nodes:
        digest = hashlib.md5(n.encode()).hexdigest()
        points += [(fn(f"{i}{digest}".encode()), n) for i in range(replicas)]
    points.sort()
    h = fn(key.encode())
    after = [p for p in points if p[0] >= h]
    return (after[0] if after else points[0])[1]


@settings(max_examples=40, deadline=None)
@given(
    nodes=st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=4, unique=True),
    key=st.text(max_size=30),
    name=st.sampled_from(["fnv1a", "fnv1"]),
)
def test_owner_matches_brute_force(nodes: list[str], key: str, name: str) -> None:
    ring = HashRing(nodes, replicas=16, hash=name)
    fn = fnv1a_64 if name == "fnv1a" else fnv1_64
    assert ring.owner(key) == _brute_owner(nodes, key, 16, fn)


def test_empty_ring_raises_lookup_error() -> None:
    with pytest.raises(LookupError):
        HashRing().owner("k")
    ring = HashRing(["a"])
    ring.set_nodes([])
    with pytest.raises(LookupError):
        ring.owner("k")


def test_invalid_replicas() -> None:
    with pytest.raises(ValueError, match="replicas"):
        HashRing(["a"], replicas=0)
    with pytest.raises(ValueError, match="unknown hash"):
        HashRing(["a"], hash="md5")


def test_nodes_sorted_and_deduplicated() -> None:
    ring = HashRing(["b", "a", "b"])
    assert ring.nodes == ("a", "b")
    assert len(ring) == 2 and "a" in ring and "c" not in ring
    assert ring.replicas == DEFAULT_REPLICAS


def test_deterministic_across_instances_and_order() -> None:
    a = HashRing(NODES)
    b = HashRing(list(reversed(NODES)))
    for key in KEYS[:2000]:
        assert a.owner(key) == b.owner(key)
        assert a.owner(key) == a.owner(key.encode())


def test_balance_with_default_replicas() -> None:
    ring = HashRing(NODES)
    counts = Counter(ring.owner(k) for k in KEYS)
    assert set(counts) == set(NODES)
    fair = len(KEYS) / len(NODES)
    # 512 replicas keep each node within +-25% of its fair share.
    for node in NODES:
        assert 0.75 * fair < counts[node] < 1.25 * fair, counts


def test_node_joining_moves_only_keys_to_the_new_node() -> None:
    ring = HashRing(NODES[:4])
    before = {k: ring.owner(k) for k in KEYS}
    ring.set_nodes(NODES)
    moved = [k for k in KEYS if ring.owner(k) != before[k]]
    assert all(ring.owner(k) == NODES[4] for k in moved)
    # About 1/5 of the keys move; never more than a third.
    assert 0.1 * len(KEYS) < len(moved) < 0.33 * len(KEYS)


def test_node_leaving_moves_only_its_keys() -> None:
    ring = HashRing(NODES)
    before = {k: ring.owner(k) for k in KEYS}
    gone = NODES[2]
    ring.set_nodes([n for n in NODES if n != gone])
    for k in KEYS:
        if before[k] != gone:
            assert ring.owner(k) == before[k]
        else:
            assert ring.owner(k) != gone


def test_single_node_owns_everything() -> None:
    ring = HashRing(["only"])
    assert {ring.owner(k) for k in KEYS[:500]} == {"only"}


def test_owner_is_consistent_while_another_thread_reshapes_the_ring() -> None:
    import threading

    small, large = NODES[:2], NODES
    ring = HashRing(small, replicas=64)
    expected = {k: (HashRing(small, 64).owner(k), HashRing(large, 64).owner(k)) for k in KEYS[:200]}
    errors: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        try:
            while not stop.is_set():
                for key, owners in expected.items():
                    assert ring.owner(key) in owners
        except BaseException as exc:
            errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    for i in range(60):
        ring.set_nodes(large if i % 2 else small)
    stop.set()
    for t in readers:
        t.join(timeout=10)
    assert not errors


def test_default_hash_spreads_keys_differing_in_last_bytes() -> None:
    # Bare FNV-1a leaves such keys close together on the ring; the default mixes them.
    for layout in range(50):
        nodes = [f"127.0.0.{layout % 7 + 1}:{1051 + layout + i}" for i in range(3)]
        ring = HashRing(nodes)
        counts = Counter(ring.owner(f"t_load-{i}") for i in range(200))
        assert min(counts[n] for n in nodes) >= 30, (nodes, counts)


def test_fmix64_is_murmur3_finaliser() -> None:
    assert fmix64(0) == 0
    # every single-bit input change flips about half of the output bits
    flips = [bin(fmix64(1 << b) ^ fmix64(0)).count("1") for b in range(64)]
    assert all(16 <= f <= 48 for f in flips)
