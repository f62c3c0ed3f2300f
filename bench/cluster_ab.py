"""Cluster checks of two checkouts in one session: did a change slow the paths that exist?

Run: python bench/cluster_ab.py --base /path/to/other/checkout [--rounds 12] [--seconds 2].
``--base`` is a checkout of the commit to compare with (``git worktree add``, its compiled
extensions built or copied); the head is this checkout. Both run at once on loopback: one
``smockron cluster`` node each, and a 3-node cluster each, idle while the other is
measured. Each round measures, for both (the order alternating, ABBA), one gRPC call in
flight for ``--seconds``: 1 and 100 checks per GetRateLimits call to the single node, and
100 checks per call to a non-owner of the 3-node cluster (every item forwarded). Printed:
medians over the rounds of checks/s and of the server's CPU per check (every node of the
measured cluster, /proc), with head/base ratios. On a shared machine the CPU per check is
the steadier of the two: the rate follows whatever else runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import grpc
from _common import ROOT, cpu_seconds, free_ports, median, wait_port

from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc
from smockron.core.hashring import HashRing

KINDS = ("1/call", "100/call", "forwarded 100/call")


@contextmanager
def nodes(checkout: Path, n: int, logs: Path) -> Iterator[tuple[list[str], list[int]]]:
    """``n`` cluster nodes of ``checkout`` (its own smockron): their addresses and pids.
    Their logs go under ``logs``, printed if the block fails (a node that died)."""
    ports = free_ports(2 * n)
    addrs = [f"127.0.0.1:{p}" for p in ports[:n]]
    env = dict(os.environ, PYTHONPATH=str(checkout), SMOCKRON_LOG_LEVEL="WARNING")
    procs, paths = [], []
    for i in range(n):
        args = [
            "cluster",
            "--grpc-address",
            addrs[i],
            "--http-address",
            f"127.0.0.1:{ports[n + i]}",
            "--peers",
            ",".join(addrs),
        ]
        paths.append(logs / f"{checkout.name}-{n}-{i}.log")
        with paths[-1].open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "smockron", *args],
                    cwd=checkout,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    try:
        for port in ports:
            wait_port(port, 30)
        yield addrs, [p.pid for p in procs]
    except BaseException:
        for proc, path in zip(procs, paths, strict=True):
            print(f"--- {path.name} (exit {proc.poll()}) ---\n{path.read_text()[-2000:]}")
        raise
    finally:
        for proc in procs:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(10)


def call(keys: list[str]) -> pb.GetRateLimitsReq:
    return pb.GetRateLimitsReq(
        requests=[
            pb.RateLimitReq(name="b", unique_key=k, hits=1, limit=10**9, duration=60_000)
            for k in keys
        ]
    )


async def measure(
    address: str, pids: list[int], keys: list[str], batch: int, seconds: float
) -> tuple[float, float]:
    """(checks/s, server CPU microseconds per check), one call in flight."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub: Any = gubernator_pb2_grpc.V1Stub(channel)  # type: ignore[no-untyped-call]
        calls = [call(keys[i : i + batch]) for i in range(0, len(keys), batch)]
        for msg in calls[:20]:  # warm up
            await stub.GetRateLimits(msg)
        done = i = 0
        cpu = sum(cpu_seconds(p) for p in pids)
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            resp = await stub.GetRateLimits(calls[i % len(calls)])
            assert not resp.responses[0].error, resp.responses[0].error
            done += len(resp.responses)
            i += 1
        elapsed = time.perf_counter() - start
        cpu = sum(cpu_seconds(p) for p in pids) - cpu
        return done / elapsed, cpu / done * 1e6


async def compare(trees: dict[str, Path], rounds: int, seconds: float) -> None:
    keys = [f"k{i}" for i in range(2000)]
    results: dict[tuple[str, str], list[tuple[float, float]]] = {
        (t, k): [] for t in trees for k in KINDS
    }
    with (
        tempfile.TemporaryDirectory() as tmp,
        nodes(trees["base"], 1, Path(tmp)) as b1,
        nodes(trees["head"], 1, Path(tmp)) as h1,
        nodes(trees["base"], 3, Path(tmp)) as b3,
        nodes(trees["head"], 3, Path(tmp)) as h3,
    ):
        single, three = {"base": b1, "head": h1}, {"base": b3, "head": h3}
        remote = {}
        for tree, (addrs, _) in three.items():
            ring = HashRing(addrs)
            remote[tree] = [k for k in keys if ring.owner(f"b_{k}") != addrs[0]][:1000]
        for r in range(rounds):
            for tree in ("base", "head") if r % 2 == 0 else ("head", "base"):
                (addr,), pids = single[tree]
                results[tree, KINDS[0]].append(await measure(addr, pids, keys, 1, seconds))
                results[tree, KINDS[1]].append(await measure(addr, pids, keys, 100, seconds))
                addrs, pids = three[tree]
                got = await measure(addrs[0], pids, remote[tree], 100, seconds)
                results[tree, KINDS[2]].append(got)
            print(f"round {r + 1}/{rounds}, load {os.getloadavg()[0]:.2f}", flush=True)
    for kind in KINDS:
        for index, what in ((0, "checks/s"), (1, "server CPU us/check")):
            base = median([x[index] for x in results["base", kind]])
            head = median([x[index] for x in results["head", kind]])
            print(
                f"{kind:19} {what:20} base {base:10,.1f}  head {head:10,.1f}  "
                f"head/base {head / base:.3f}"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the checkout to compare with")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}; base {args.base}, head {ROOT}")
    asyncio.run(compare({"base": args.base.resolve(), "head": ROOT}, args.rounds, args.seconds))
