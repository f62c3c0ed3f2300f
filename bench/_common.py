"""Helpers every benchmark shares: running a daemon, reading its CPU time, statistics.

Benchmarks run as ``python bench/NAME.py``, so this directory is on ``sys.path`` and they
import this module as ``_common``; it puts the checkout root on the path as well, so the
benchmarks measure this checkout's smockron and can reuse ``tests.support``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support import free_port, free_ports, smockron_env, wait_port  # noqa: E402

__all__ = [
    "ROOT",
    "callgrind_instructions",
    "cpu_seconds",
    "daemon",
    "free_port",
    "free_ports",
    "full_gc_ms",
    "median",
    "percentile",
    "smockron_env",
    "thread_schedstat",
    "wait_port",
]


@contextlib.contextmanager
def daemon(args: list[str], port: int) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``python -m smockron ARGS`` until the block ends; wait for ``port`` first.

    Output is discarded and logging kept at WARNING so the daemon spends its time serving.
    """
    env = dict(smockron_env(), SMOCKRON_LOG_LEVEL="WARNING")
    proc = subprocess.Popen(
        [sys.executable, "-m", "smockron", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, timeout=15.0)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def callgrind_instructions(argv: list[str], env: dict[str, str] | None = None) -> int:
    """Every instruction ``python argv...`` executes, all its threads (callgrind's total:
    load-independent, for A/B figures on a shared machine). Needs valgrind."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable]
    done = subprocess.run([*cmd, *argv], env=env, capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no callgrind total in:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def cpu_seconds(pid: int, gone: float | None = None) -> float:
    """User + system CPU time of a process (Linux /proc): robust on a shared machine.
    ``gone``: what a process that has exited counts (None: an error)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        if gone is None:
            raise
        return gone
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_schedstat(pid: int) -> dict[str, tuple[float, float]]:
    """Per thread of ``pid``: (seconds on CPU, seconds waiting for a CPU), from
    /proc/PID/task/TID/schedstat (nanoseconds: unlike the clock ticks of
    :func:`cpu_seconds`, a thread that wakes often and briefly is not charged whole
    ticks); the second is the CPU contention it suffered."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                run_ns, wait_ns, _ = f.read().split()
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        out[f"{name}/{tid}"] = (int(run_ns) / 1e9, int(wait_ns) / 1e9)
    return out


def percentile(samples: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; no interpolation, cheap on big samples."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def median(values: list[float]) -> float:
    return statistics.median(values)


def full_gc_ms(rounds: int = 5) -> float:
    """Median pause of a full garbage collection, in ms: what a large store of GC-tracked
    states adds to every message or call queued behind one (two collections first, so
    objects the collector can untrack are untracked)."""
    gc.collect()
    gc.collect()
    pauses = []
    for _ in range(rounds):
        start = time.perf_counter()
        gc.collect()
        pauses.append((time.perf_counter() - start) * 1000)
    return statistics.median(pauses)


def paced_accounting(
    pub: Any, heads: Sequence[bytes], idents: Sequence[bytes], rate: float, seconds: float
) -> int:
    """Publish ``rate`` accounting messages a second (ACCEPTED, identifiers in turn, topic
    ``heads[k]`` for ``idents[k]``) for ``seconds``, every millisecond what is owed, frame
    by frame through pyzmq's compiled send (a bench's load must not be its bottleneck);
    returns how many were sent."""
    import zmq

    raw_send = zmq.backend.Socket.send  # type: ignore[attr-defined]
    more, last = zmq.SNDMORE | zmq.NOBLOCK, zmq.NOBLOCK
    count = len(idents)
    tick, owed, seq = 0.001, 0.0, 0
    start = next_tick = time.perf_counter()
    while next_tick - start < seconds:
        owed += rate * tick
        ts = b"%d" % int(time.time() * 1000)
        while owed >= 1:
            owed -= 1
            seq += 1
            k = seq % count
            raw_send(pub, heads[k], more)
            raw_send(pub, b"ACCEPTED", more)
            raw_send(pub, idents[k], more)
            raw_send(pub, ts, more)
            raw_send(pub, b"", last)
        next_tick += tick
        pause = next_tick - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    print(f"sent {seq} in {time.perf_counter() - start:.2f}s", flush=True)
    return seq
