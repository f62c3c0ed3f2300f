"""The cluster client's instructions per check, counted by callgrind: a load-independent
figure for an A/B of two checkouts on a shared machine.

    python bench/client_instructions.py [--base OTHER_CHECKOUT] [--modes single,routed,batch]
        [--checks 500]

For each checkout and mode, the client runs twice under ``valgrind --tool=callgrind``
(``--checks`` and three times as many), against real ``smockron cluster`` nodes of the
same checkout started outside valgrind; the difference of the two totals over the
difference in checks is the client's cost per check, start-up and warm-up cancelled out.
Modes: ``single`` (``Client.check`` to a one-node cluster), ``routed`` (``Client.check``
on a three-node cluster, each check sent to its owner), ``batch`` (``get_rate_limits`` of
100 checks to one node; ten times the checks). The ring is refreshed once an hour, so
that the refreshes a slowed-down process makes do not count (under callgrind a check
takes some 50 times as long). Every figure counts every thread of the client process,
gRPC's included. Needs valgrind (apt-get install valgrind).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from _common import ROOT, callgrind_instructions, free_ports, wait_port

MODES = ("single", "routed", "batch")


def client(tree: Path, mode: str, checks: int) -> None:
    """The measured process: nodes started, warm-up, then ``checks`` checks."""
    sys.path.insert(0, str(tree))
    from smockron.cluster.client import Client
    from smockron.cluster.model import RateLimitRequest

    count = 3 if mode == "routed" else 1
    ports = free_ports(2 * count)
    addrs = [f"127.0.0.1:{p}" for p in ports[:count]]
    env = dict(os.environ, PYTHONPATH=str(tree), SMOCKRON_LOG_LEVEL="WARNING")
    procs = []
    for i in range(count):
        argv = [sys.executable, "-m", "smockron", "cluster", "--grpc-address", addrs[i]]
        argv += ["--http-address", f"127.0.0.1:{ports[count + i]}"]
        if count > 1:
            argv += ["--peers", ",".join(addrs)]
        out = subprocess.DEVNULL
        procs.append(subprocess.Popen(argv, env=env, cwd=tree, stdout=out, stderr=out))
    try:
        for port in ports:
            wait_port(port, timeout=30.0)
        c = Client(addrs if count > 1 else addrs[0], timeout=30, ring_refresh=3600)
        for i in range(50):
            c.check("b", f"w{i}", 1, 10**9, 60_000)
        if mode == "batch":
            for i in range(checks // 100):
                c.get_rate_limits(
                    [RateLimitRequest("b", f"k{i}-{j}", 1, 10**9, 60_000) for j in range(100)]
                )
        else:
            for i in range(checks):
                c.check("b", f"k{i}", 1, 10**9, 60_000)
        c.close()
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


def instructions(tree: Path, mode: str, checks: int) -> int:
    return callgrind_instructions([__file__, "--client", str(tree), mode, str(checks)])


def per_check(tree: Path, mode: str, checks: int) -> float:
    checks *= 10 if mode == "batch" else 1
    low = instructions(tree, mode, checks)
    high = instructions(tree, mode, 3 * checks)
    return (high - low) / (2 * checks)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--client":
        client(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, help="another checkout to compare with")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--checks", type=int, default=500)
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    trees = {"head": ROOT, **({"base": args.base.resolve()} if args.base else {})}
    for mode in args.modes.split(","):
        found = {name: per_check(tree, mode, args.checks) for name, tree in trees.items()}
        line = "; ".join(f"{name} {value:,.0f}" for name, value in found.items())
        ratio = f" (head / base {found['head'] / found['base']:.3f})" if "base" in found else ""
        print(f"{mode}: instructions per check: {line}{ratio}", flush=True)


if __name__ == "__main__":
    main()
