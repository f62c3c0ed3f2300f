"""DELAY_UNTILs published at a fixed rate vs received by 1 and 4 gatekeepers.

A publisher plays the master (a bound PUB, messages as the master sends them, paced at
``--rate``); each gatekeeper (asyncio twin and threaded, in processes of their own)
counts what it applied. Goal: >= 99.9% received at 200,000/s per gatekeeper. Baseline in
the same run: a bare pyzmq SUB doing only ``recv_multipart``.

Run: python bench/control_plane.py [--messages 1000000] [--rate 200000] [--rounds 3]
Traffic goes to 127.0.0.1 only; every process stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zmq

from smockron.wire.batchio import send_all
from smockron.wire.codec import encode_control
from tests.support import free_port, smockron_env


def receiver(kind: str, control: str, seconds: float) -> None:
    """Role: receive for ``seconds`` after the first message, print the count."""
    if kind == "raw":
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.subscribe(b"api\0")
        sub.connect(control)
        print("ready", flush=True)
        n = 0
        deadline = None
        while deadline is None or time.monotonic() < deadline:
            if sub.poll(100):
                sub.recv_multipart()
                n += 1
                deadline = deadline or time.monotonic() + seconds
        print("got", n, flush=True)
        return
    from smockron.gatekeeper.core import AsyncGatekeeper, Gatekeeper

    if kind == "threaded":
        gk = Gatekeeper(None, control, ["api"], max_entries=2_000_000)
        print("ready", flush=True)
        while gk.counters.control_received == 0:
            time.sleep(0.01)
        time.sleep(seconds)
        print("got", gk.counters.control_received, flush=True)
        gk.close()
        return

    async def run() -> None:
        agk = AsyncGatekeeper(None, control, ["api"], max_entries=2_000_000)
        agk.start()
        print("ready", flush=True)
        while agk.counters.control_received == 0:
            await asyncio.sleep(0.01)
        await asyncio.sleep(seconds)
        print("got", agk.counters.control_received, flush=True)
        await agk.aclose()

    asyncio.run(run())


def one_round(kind: str, gatekeepers: int, messages: int, rate: float) -> list[float]:
    port = free_port()
    control = f"tcp://127.0.0.1:{port}"
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 100_000)  # the master's default --hwm
    pub.bind(control)
    seconds = messages / rate + 2.0
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--role",
                kind,
                "--control",
                control,
                "--seconds",
                str(seconds),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=smockron_env(),
        )
        for _ in range(gatekeepers)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # subscriptions reach the publisher
        far = int(time.time() * 1000) + 3_600_000
        batch = [encode_control("api", b"id-%d" % i, far) for i in range(1000)]
        start = time.perf_counter()
        sent = 0
        for k in range(messages // 1000):
            due = start + k * 1000 / rate
            while time.perf_counter() < due:
                time.sleep(0)
            sent += send_all(pub, batch)
        got = []
        for p in procs:
            assert p.stdout is not None
            got.append(int(p.stdout.readline().split()[1]))
        return [g / sent for g in got]
    finally:
        for p in procs:
            p.wait(30)
        pub.close(0)
        ctx.term()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role")
    parser.add_argument("--control")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=200_000.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.role:
        receiver(args.role, args.control, args.seconds)
        return
    print(f"{args.messages:,} DELAY_UNTILs at {args.rate:,.0f}/s, medians of {args.rounds}")
    for kind in ("raw", "async", "threaded"):
        for n in (1, 4):
            shares = [min(one_round(kind, n, args.messages, args.rate))
                      for _ in range(args.rounds)]  # fmt: skip
            median = statistics.median(shares)
            goal = (
                ""
                if kind == "raw"
                else f"  goal >= 99.9%: {'MET' if median >= 0.999 else 'NOT MET'}"
            )
            print(f"  {kind:8} x{n}: worst gatekeeper received {median:.2%} "
                  f"(rounds {', '.join(f'{s:.2%}' for s in shares)}){goal}")  # fmt: skip


if __name__ == "__main__":
    main()
