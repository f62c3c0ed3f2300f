"""Accounting messages per second through `smockron router`, against a master fed directly.

    python bench/router.py [--messages 200000] [--senders 2] [--runs 3]

Method: bench/master_throughput.py's (its sender processes and workload: 6-frame
ACCEPTED messages, 10,000 identifiers, one domain). The process measured is stopped
(SIGSTOP) while the senders send everything, then resumed, and timed until the masters'
``messages_total`` counts every message:

* ``direct``: senders -> one master; the master is stopped and measured;
* ``router, by domain``: senders -> router -> one master (the domain's); the router is
  stopped, so its drain and forwarding are what is timed (the master, running, keeps up
  with it or not: the figure is the pair's);
* ``router, by identifier``: senders -> router -> two masters peered as a fleet with
  ``--replicas 1`` (each holds half the shards); the router is stopped, as above.

Each configuration runs ``--runs`` rounds; the medians and their ratios to ``direct``
are printed. Every process shares this machine's cores: on a two-core machine the
router, its masters and their ZeroMQ I/O threads compete for them, which a deployment
with the router on a machine of its own would not.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import master_throughput as mt
from _common import ROOT, cpu_seconds, free_port, median

RULES = ["--rule", mt.RULE, "--rule", "probe:1/s:1"]


def addr(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


@contextmanager
def process(args: Sequence[str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "smockron", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=mt.env(),
            cwd=ROOT,
        )
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def master_args(
    acc: int, ctl: int, met: int, expected: int, peer: tuple[int, int] | None
) -> list[str]:
    args = [
        "master",
        "--accounting",
        addr(acc),
        "--control",
        addr(ctl),
        "--metrics",
        f"127.0.0.1:{met}",
        "--skew-tolerance",
        "3600",
        "--stats-interval",
        "0",
        "--queue",
        str(max(expected, 100_000)),
        "--hwm",
        "10000000",
        *RULES,
    ]
    if peer is not None:
        args += ["--peer", f"{addr(peer[0])},{addr(peer[1])}", "--replicas", "1"]
    return args


def handled(metrics: list[int]) -> int:
    return sum(mt.scrape_total(port) for port in metrics)


def measure(kind: str, messages: int, n_senders: int, logdir: Path) -> tuple[float, float, float]:
    """One round of ``kind`` (direct, domain or identifier): messages per second, and the
    CPU time per message (us, every thread) of the process stopped and of the masters."""
    expected = sum(n for _, n in mt.workload(messages))
    masters = 2 if kind == "identifier" else 1
    ports = [(free_port(), free_port(), free_port()) for _ in range(masters)]
    stamp = time.time_ns()
    with ExitStack() as stack:
        procs = []
        for i, (acc, ctl, met) in enumerate(ports):
            peer = ports[1 - i][:2] if masters == 2 else None
            procs.append(
                stack.enter_context(
                    process(
                        master_args(acc, ctl, met, expected, peer), logdir / f"m{i}-{stamp}.log"
                    )
                )
            )
        if kind == "direct":
            target, (acc, ctl) = procs[0], ports[0][:2]
        else:
            acc, ctl = free_port(), free_port()
            router = [
                "router",
                "--accounting",
                addr(acc),
                "--control",
                addr(ctl),
                "--shard-by",
                kind,
                "--hwm",
                "10000000",
            ]
            for m_acc, m_ctl, _ in ports:
                router += ["--master", f"{addr(m_acc)},{addr(m_ctl)}"]
            target = stack.enter_context(process(router, logdir / f"router-{stamp}.log"))
        senders = mt.start_senders(acc, ctl, n_senders, messages)
        for sender in senders:
            stack.callback(sender.kill)
        base = handled([p[2] for p in ports])  # the probes
        total = mt.send_all(target, senders)
        assert total == expected, (total, expected)
        cpu0 = [cpu_seconds(p.pid) for p in [target, *procs]]
        t0 = time.time()
        target.send_signal(signal.SIGCONT)
        deadline = t0 + 120
        done = 0
        while time.time() < deadline:
            done = handled([p[2] for p in ports]) - base
            if done >= total:
                break
            time.sleep(0.01)
        t1 = time.time()
        cpu = [cpu_seconds(p.pid) - c for p, c in zip([target, *procs], cpu0, strict=True)]
        mt.finish(senders)
        if done < total:
            raise RuntimeError(f"{kind}: the masters handled {done} of {total}")
        masters_cpu = sum(cpu[1:]) if kind != "direct" else cpu[0]
        return total / (t1 - t0), cpu[0] / total * 1e6, masters_cpu / total * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--senders", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    kinds = {
        "direct": "master fed directly",
        "domain": "router, by domain (1 master)",
        "identifier": "router, by identifier (2 masters)",
    }
    rounds: dict[str, list[tuple[float, float, float]]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.runs):  # rounds interleaved: the machine's load hits all alike
            for kind in kinds:
                rounds[kind].append(measure(kind, args.messages, args.senders, Path(tmp)))
                rate, own, masters = rounds[kind][-1]
                print(
                    f"  {kind}: {rate:,.0f} msg/s, CPU {own:.2f} us/msg (stopped process), "
                    f"{masters:.2f} us/msg (masters)",
                    flush=True,
                )
    direct = median([r[0] for r in rounds["direct"]])
    print(f"\n{args.messages:,} messages, {args.senders} senders, median of {args.runs}:")
    for kind, label in kinds.items():
        rate = median([r[0] for r in rounds[kind]])
        own = median([r[1] for r in rounds[kind]])
        masters = median([r[2] for r in rounds[kind]])
        router = f"router CPU {own:5.2f} us/msg" if kind != "direct" else " " * 25
        print(
            f"  {label:34s} {rate:>9,.0f} msg/s  x{rate / direct:.2f}  {router}  "
            f"masters' CPU {masters:5.2f} us/msg"
        )


if __name__ == "__main__":
    main()
