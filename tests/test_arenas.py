"""pymalloc's free pools handed back (smockron/_arenas.c, smockron.memory).

Each case runs in a fresh interpreter (the arena allocator it installs is process-wide):
a wave of objects of every small size is made, a few survivors kept in each arena (as a
daemon's counters and timers are), the rest freed; the release must give back most of
the wave's RSS, and the interpreter must go on allocating and freeing correctly from
the released pools: every value read back is checked, many rounds over.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from smockron import memory

pytestmark = pytest.mark.skipif(
    memory._arenas is None
    or not sys.platform.startswith("linux")
    or sys.version_info[:2] not in ((3, 11), (3, 12)),
    reason="smockron._arenas is not built (Linux, CPython 3.11 and 3.12 only)",
)

PROGRAM = textwrap.dedent(
    """
    import gc, json, random, sys
    from smockron import memory

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    tracked = memory.track_arenas()
    base = rss()

    def wave(n, seed):
        # floats, ints, tuples, bytes and small lists: size classes 32 to 512 bytes
        rng = random.Random(seed)
        made = []
        for i in range(n):
            k = rng.randrange(5)
            if k == 0:
                made.append(float(i) + 0.5)
            elif k == 1:
                made.append(i * 1_000_003)
            elif k == 2:
                made.append((i, -i, i * 2)[: rng.randrange(1, 4)])
            elif k == 3:
                made.append(b"x" * rng.randrange(1, 470) + b"%d" % i)
            else:
                made.append([i] * rng.randrange(1, 8))
        return made

    def check(survivors):
        for i, v in survivors:
            assert made_value_ok(i, v), (i, v)

    def made_value_ok(i, v):
        if isinstance(v, float):
            return v == float(i) + 0.5
        if isinstance(v, int):
            return v == i * 1_000_003
        if isinstance(v, tuple):
            return v == (i, -i, i * 2)[: len(v)]
        if isinstance(v, bytes):
            return v.endswith(b"%d" % i) and set(v[: -len(b"%d" % i)]) <= {ord("x")}
        return v == [i] * len(v)

    results = {"tracked": tracked}
    first = []
    for round_ in range(int(sys.argv[1])):
        made = wave(400_000, round_)
        peak = rss()
        # one object in 2,000 outlives the wave, as a counter made during one does; the
        # first wave's stay to the end, each later wave's until the next
        survivors = [(i, made[i]) for i in range(0, len(made), 2000)]
        first = first or survivors
        del made
        gc.collect()
        kept = rss()
        released = memory.release_free_pools()
        after = rss()
        results.setdefault("rounds", []).append([peak, kept, released, after])
        check(survivors)
        check(first)
    results["base"] = base
    results["stats"] = memory._arenas.stats()
    print(json.dumps(results))
    """
)


def _run(rounds: int, **env: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(rounds)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_free_pools_of_pinned_arenas_are_handed_back_and_reused_safely() -> None:
    """Survivors spread over every arena keep all of them; their free pools' pages go
    back (all of a free pool but its header's page: over half the wave), and five more
    waves reuse the released pools with every survivor intact."""
    result = _run(6)
    assert result["tracked"] is True
    rounds = result["rounds"]
    assert isinstance(rounds, list)
    mb = [[round(x / 2**20, 1) for x in r] for r in rounds]
    for peak, kept, released, after in rounds:
        wave = peak - result["base"]  # type: ignore[operator]
        assert kept > result["base"] + wave // 2, mb  # the survivors pinned the arenas
        assert released > wave // 2, mb
        assert after < kept - wave // 2, mb
    stats = result["stats"]
    assert isinstance(stats, dict) and stats["arenas"] > 0 and stats["released_pages"] > 0


def test_nothing_is_released_on_glibc_malloc() -> None:
    """With ``PYTHONMALLOC=malloc`` pymalloc takes no arena: the release does nothing
    (and reads no memory it does not own)."""
    result = _run(1, PYTHONMALLOC="malloc")
    rounds = result["rounds"]
    assert isinstance(rounds, list)
    assert [r[2] for r in rounds] == [0]
    stats = result["stats"]
    assert isinstance(stats, dict) and stats["arenas"] == 0


def test_the_switch_keeps_free_pools() -> None:
    """``SMOCKRON_RELEASE_FREE_POOLS=0``: nothing tracked, nothing released."""
    result = _run(1, SMOCKRON_RELEASE_FREE_POOLS="0")
    assert result["tracked"] is False
    rounds = result["rounds"]
    assert isinstance(rounds, list) and [r[2] for r in rounds] == [0]
