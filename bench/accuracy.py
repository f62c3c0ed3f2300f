"""Accuracy of the whole system: one master, four gatekeeper proxies, real processes.

An abusive client sends at ``--factor`` times its rule (default 10x), round-robin over
the proxies, for ``--duration`` seconds (default 30). Requests that reach the backend
inside the window are compared with the ideal ``burst + rate x T``; goal <= 1.02x.
At the same time a polite client sends at 0.9x its rate; goal: zero delayed or rejected.

Each round is run once per master algorithm (``--algorithm history,gcra``): the seed's
history rule and GCRA.

Run: python bench/accuracy.py [--duration 30] [--rounds 1] [--algorithm history,gcra]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
from aiohttp import web

from smockron.core.rules import parse_rule_spec
from tests.gatekeeper.commands import proxy_args
from tests.support import free_ports, smockron_env, wait_port


def smockron(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "smockron", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=smockron_env(),
        )


async def one_round(args: argparse.Namespace, workdir: Path) -> tuple[float, Counter[str], int]:
    domain, rule = parse_rule_spec(args.rule)
    n = args.proxies
    acc, ctl, back, *ports = free_ports(3 + n)
    accounting, control = f"tcp://127.0.0.1:{acc}", f"tcp://127.0.0.1:{ctl}"
    arrivals: dict[str, list[float]] = {"abusive": [], "polite": []}

    async def handle(request: web.Request) -> web.Response:
        who = request.headers.get("X-Client", "")
        if who in arrivals:
            arrivals[who].append(time.monotonic())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", back).start()
    master = smockron(
        ["master", "--accounting", accounting, "--control", control, "--rule", args.rule,
         "--stats-interval", "0", "--algorithm", f"{domain}={args.algorithm}"],
        workdir / "master.log",
    )  # fmt: skip
    proxies = [
        smockron(
            proxy_args(
                p,
                back,
                accounting,
                control,
                "--decision-header",
                "--no-loginfo",
                domain=domain,
                max_delay=args.max_delay,
            ),
            workdir / f"proxy-{p}.log",
        )
        for p in ports
    ]
    decisions: Counter[str] = Counter()
    try:
        for p in ports:
            await asyncio.to_thread(wait_port, p)
        await asyncio.sleep(1.5)  # connections and subscriptions settle
        urls = [f"http://127.0.0.1:{p}/" for p in ports]
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=30)
        ) as session:
            t0 = time.monotonic() + 0.05

            async def one(who: str, i: int) -> None:
                try:
                    async with session.get(urls[i % n], headers={"X-Client": who}) as r:
                        await r.read()
                        decisions[f"{who} {r.headers.get('X-Smockron-Decision', r.status)}"] += 1
                except (aiohttp.ClientError, TimeoutError):
                    decisions[f"{who} error"] += 1

            async def client(who: str, rate: float) -> None:
                tasks = set()
                i = 0
                while (at := t0 + i / rate) < t0 + args.duration:
                    await asyncio.sleep(max(0.0, at - time.monotonic()))
                    task = asyncio.create_task(one(who, i))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    i += 1
                if tasks:
                    await asyncio.wait(tasks, timeout=30)

            await asyncio.gather(
                client("abusive", args.factor * rule.rate),
                client("polite", args.polite * rule.rate),
            )
        through = sum(1 for t in arrivals["abusive"] if t0 <= t <= t0 + args.duration)
        ideal = rule.burst + rule.rate * args.duration
        return through / ideal, decisions, through
    finally:
        for proc in [*proxies, master]:
            proc.terminate()
        for proc in [*proxies, master]:
            proc.wait(10)
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per round")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--rule", default="acc:10/s:20", help="DOMAIN:RATE/UNIT:BURST")
    parser.add_argument("--proxies", type=int, default=4)
    parser.add_argument("--factor", type=float, default=10.0, help="abusive rate / rule rate")
    parser.add_argument("--polite", type=float, default=0.9, help="polite rate / rule rate")
    parser.add_argument("--max-delay", default="2s")
    parser.add_argument(
        "--algorithm", default="history,gcra", help="the master's, comma-separated: history, gcra"
    )
    args = parser.parse_args()
    _, rule = parse_rule_spec(args.rule)
    ideal = rule.burst + rule.rate * args.duration
    print(
        f"accuracy, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs "
        f"(shared); rule {args.rule}, {args.proxies} proxies, abusive {args.factor:g}x, "
        f"polite {args.polite:g}x, {args.duration:g} s, ideal {ideal:g}"
    )
    for algorithm in args.algorithm.split(","):
        args_for = argparse.Namespace(**{**vars(args), "algorithm": algorithm})
        ratios = []
        polite_slowed = []
        for r in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="smockron-accuracy-") as tmp:
                ratio, decisions, through = asyncio.run(one_round(args_for, Path(tmp)))
            slowed = sum(
                v for k, v in decisions.items() if k.startswith("polite ") and "accept" not in k
            )
            ratios.append(ratio)
            polite_slowed.append(slowed)
            print(f"  [{algorithm}] round {r + 1}: let through {through} / ideal {ideal:g} = "
                  f"{ratio:.3f}x; decisions {dict(sorted(decisions.items()))}")  # fmt: skip
        median = statistics.median(ratios)
        print(f"[{algorithm}] abusive: median let-through / ideal = {median:.3f}x  goal <= 1.02x: "
              f"{'MET' if median <= 1.02 else 'NOT MET'}")  # fmt: skip
        print(f"[{algorithm}] polite: delayed or rejected = {polite_slowed}  goal 0: "
              f"{'MET' if not any(polite_slowed) else 'NOT MET'}")  # fmt: skip


if __name__ == "__main__":
    main()
