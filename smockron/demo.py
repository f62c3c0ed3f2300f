"""``smockron demo``: a master, two gatekeeper proxies, a backend and three clients.

Everything runs on this machine with nothing else installed: the master is a
``python -m smockron master`` subprocess (in-memory store); the backend and the two
proxies run in this process on loopback ports. A well-behaved client stays under its
rule, an abusive one sends evenly at many times its rule and a bursty one sends bursts
of concurrent requests (20 at once every 250 ms), all spread over both gatekeepers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import click
from aiohttp import web

from smockron import runtime
from smockron.core.rules import Rule, parse_rate
from smockron.gatekeeper._asyncio import AsyncGatekeeper
from smockron.gatekeeper.httpgate import HttpGate
from smockron.gatekeeper.identify import header
from smockron.gatekeeper.proxy import DECISION_HEADER, GatekeeperProxy
from smockron.settings import SmockronCommand, print_settings_if_asked

DOMAIN = "demo"
CLIENTS = ("polite", "abusive", "bursty")
GATEKEEPERS = ("gk1", "gk2")
VERDICTS = ("accept", "delay", "reject")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Scenario:
    rule: Rule
    duration_s: float
    polite_rate: float
    abusive_rate: float
    max_delay_ms: int = 1500
    bursty_size: int = 20
    bursty_every_s: float = 0.25

    def allowance(self, elapsed: float) -> float:
        """What the rule lets one client through in ``elapsed`` seconds: burst + rate x T."""
        return self.rule.burst + self.rule.rate * elapsed


@dataclass
class Tally:
    """Per client and gatekeeper: responses by verdict; backend arrivals by client."""

    counts: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    arrivals: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in CLIENTS})

    def get(self, client: str, gk: str, verdict: str) -> int:
        return self.counts[(client, gk, verdict)]

    def total(self, client: str, verdict: str) -> int:
        return sum(self.get(client, gk, verdict) for gk in GATEKEEPERS)


def reached(tally: Tally, client: str, t0: float, span: float) -> int:
    """Requests of ``client`` that reached the backend in the first ``span`` seconds."""
    return sum(1 for t in tally.arrivals[client] if t0 <= t <= t0 + span)


def allowed(scenario: Scenario, span: float) -> int:
    """Requests the rule lets one client through in ``span`` seconds, whole."""
    return math.floor(scenario.allowance(span))


def table(tally: Tally, scenario: Scenario, t0: float, span: float) -> str:
    """The live table: responses by verdict so far, then what reached the backend in the
    first ``span`` seconds beside what the rule allows in as long (what the summary
    compares, counted the same way)."""
    lines = [
        f"t = {span:5.1f} s",
        f"  {'client':8} {'gatekeeper':10} {'accepted':>9} {'delayed':>8} {'rejected':>9}",
    ]
    for client in CLIENTS:
        for gk in GATEKEEPERS:
            a, d, r = (tally.get(client, gk, v) for v in VERDICTS)
            lines.append(f"  {client:8} {gk:10} {a:9d} {d:8d} {r:9d}")
    lines.append(f"  {'client':8} {'reached the backend':>20} {'rule allows':>12}")
    for client in CLIENTS:
        through = reached(tally, client, t0, span)
        lines.append(f"  {client:8} {through:20d} {allowed(scenario, span):12d}")
    return "\n".join(lines)


async def backend(tally: Tally, port: int) -> web.AppRunner:
    async def handle(request: web.Request) -> web.Response:
        client = request.headers.get("X-Client", "")
        if client in tally.arrivals:
            tally.arrivals[client].append(time.monotonic())
        return web.Response(text="ok\n")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def steady(rate: float, duration_s: float) -> list[float]:
    """Send times of an even client: one request every 1/rate s."""
    return [i / rate for i in range(math.ceil(rate * duration_s))]


def bursts(size: int, every_s: float, duration_s: float) -> list[float]:
    """Send times of a bursty client: ``size`` requests at once every ``every_s``."""
    return [k * every_s for k in range(math.ceil(duration_s / every_s)) for _ in range(size)]


async def drive(
    session: aiohttp.ClientSession,
    client: str,
    offsets: Sequence[float],
    urls: list[str],
    tally: Tally,
    t0: float,
) -> None:
    """Open-loop client: a request at each of ``offsets`` (sorted, seconds after ``t0``),
    whatever the responses take; requests sent together are in flight together."""
    tasks: set[asyncio.Task[None]] = set()

    async def one(i: int) -> None:
        gk = GATEKEEPERS[i % len(urls)]
        try:
            async with session.get(urls[i % len(urls)], headers={"X-Client": client}) as r:
                await r.read()
                verdict = r.headers.get(DECISION_HEADER, "error")
        except (aiohttp.ClientError, TimeoutError):
            verdict = "error"
        if verdict in VERDICTS:
            tally.counts[(client, gk, verdict)] += 1
        else:
            tally.errors[client] += 1

    try:
        for i, offset in enumerate(offsets):
            if (wait := t0 + offset - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            task = asyncio.create_task(one(i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks, timeout=10)
    finally:  # cut short (Ctrl-C) or timed out: no request outlives its session
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def held(tally: Tally, scenario: Scenario, t0: float, client: str, how: str) -> list[str]:
    """What ``client`` sent, and what reached the backend next to what its rule allows."""
    rule, duration = scenario.rule, scenario.duration_s
    through = reached(tally, client, t0, duration)
    ideal = allowed(scenario, duration)
    sent = sum(tally.total(client, v) for v in VERDICTS)
    return [
        f"  {client} client: sent {sent} requests ({how}), {through} reached the backend in "
        f"{duration:g} s; the rule allows {ideal:g} (burst {rule.burst} + {rule.rate:g}/s x "
        f"{duration:g} s): held to {through / ideal:.2f}x its rule",
        f"  {client} client: {tally.total(client, 'delay')} delayed, "
        f"{tally.total(client, 'reject')} rejected with 503",
    ]


def bursty_how(scenario: Scenario) -> str:
    rate = scenario.bursty_size / scenario.bursty_every_s
    return (
        f"{scenario.bursty_size} at once every {scenario.bursty_every_s * 1000:g} ms, "
        f"{rate / scenario.rule.rate:.0f}x its rule"
    )


def summarize(tally: Tally, scenario: Scenario, t0: float) -> list[str]:
    polite_slowed = tally.total("polite", "delay") + tally.total("polite", "reject")
    polite_sent = sum(tally.total("polite", v) for v in VERDICTS)
    lines = ["", "Summary"]
    if polite_slowed == 0:
        lines.append(f"  well-behaved client: never slowed ({polite_sent} requests, all accepted)")
    else:
        lines.append(
            f"  well-behaved client: slowed {polite_slowed} times out of {polite_sent} requests"
        )
    abusive_how = f"{scenario.abusive_rate / scenario.rule.rate:.0f}x its rule"
    lines += held(tally, scenario, t0, "abusive", abusive_how)
    lines += held(tally, scenario, t0, "bursty", bursty_how(scenario))
    if sum(tally.errors.values()):
        lines.append(f"  transport errors: {dict(tally.errors)}")
    return lines


async def run_demo(scenario: Scenario, log_path: Path, live: bool) -> list[str]:
    acc, ctl, back = free_port(), free_port(), free_port()
    accounting, control = f"tcp://127.0.0.1:{acc}", f"tcp://127.0.0.1:{ctl}"
    rule = scenario.rule
    spec = f"{DOMAIN}:{rule.rate:g}/s:{rule.burst}"
    with open(log_path, "wb") as log:
        master = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "smockron",
                "master",
                "--accounting",
                accounting,
                "--control",
                control,
                "--rule",
                spec,
                "--stats-interval",
                "0",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    tally = Tally()
    runner = await backend(tally, back)
    proxies: list[GatekeeperProxy] = []
    urls = []
    try:
        for _ in GATEKEEPERS:
            gate = HttpGate(DOMAIN, header("X-Client"))
            gk = AsyncGatekeeper(accounting, control, [DOMAIN], max_delay_ms=scenario.max_delay_ms)
            proxy = GatekeeperProxy(f"http://127.0.0.1:{back}", gate, gk, decision_header=True)
            port = free_port()
            await proxy.start("127.0.0.1", port)
            proxies.append(proxy)
            urls.append(f"http://127.0.0.1:{port}/")
        deadline = time.monotonic() + 20
        while not all(p.gatekeeper.master_connected for p in proxies):
            if master.poll() is not None or time.monotonic() > deadline:
                raise click.ClickException(
                    f"the master did not start; its log:\n{log_path.read_text()}"
                )
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # let the control subscriptions reach the master
        print(
            f"master on {accounting} / {control}, rule {spec}; gatekeepers {urls[0]} and "
            f"{urls[1]}; polite client {scenario.polite_rate:g}/s, abusive "
            f"{scenario.abusive_rate:g}/s, bursty {bursty_how(scenario)}, for "
            f"{scenario.duration_s:g} s\n",
            flush=True,
        )
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            t0 = time.monotonic()
            duration = scenario.duration_s
            drivers = asyncio.gather(
                drive(session, "polite", steady(scenario.polite_rate, duration), urls, tally, t0),
                drive(session, "abusive", steady(scenario.abusive_rate, duration), urls, tally, t0),
                drive(
                    session,
                    "bursty",
                    bursts(scenario.bursty_size, scenario.bursty_every_s, duration),
                    urls,
                    tally,
                    t0,
                ),
            )
            await show_live(drivers, tally, scenario, t0, live)
        # the window the summary counts: requests still held past it arrive too late
        print(table(tally, scenario, t0, duration), flush=True)
        return summarize(tally, scenario, t0)
    finally:
        for proxy in proxies:
            await proxy.close()
        await runner.cleanup()
        master.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            master.wait(10)
        if master.poll() is None:
            master.kill()
            master.wait()


async def show_live(
    drivers: asyncio.Future[Any], tally: Tally, scenario: Scenario, t0: float, live: bool
) -> None:
    """Redraw the table once a second (in place on a terminal) until the clients finish."""
    height = 0
    while True:
        try:
            await asyncio.wait_for(asyncio.shield(drivers), 1.0)
            break
        except TimeoutError:
            pass
        except asyncio.CancelledError:  # Ctrl-C: the clients stop with the table
            drivers.cancel()
            await asyncio.gather(drivers, return_exceptions=True)
            raise
        text = table(tally, scenario, t0, min(time.monotonic() - t0, scenario.duration_s))
        if live and height:
            sys.stdout.write(f"\x1b[{height}F\x1b[J")
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        height = text.count("\n") + 1
    await drivers
    if live and height:
        sys.stdout.write(f"\x1b[{height}F\x1b[J")


@click.command(cls=SmockronCommand)
@click.option("--duration", type=float, default=15.0, show_default=True, help="Seconds of traffic.")
@click.option("--rate", default="5/s", show_default=True, help="The rule's rate.")
@click.option("--burst", type=int, default=10, show_default=True, help="The rule's burst.")
@click.option("--abuse", type=float, default=8.0, show_default=True, help="Abusive rate / rule.")
def demo(duration: float, rate: str, burst: int, abuse: float) -> None:
    """See a master and two gatekeepers hold an abusive and a bursty client to their rule."""
    if duration <= 0:
        raise click.BadParameter("must be > 0", param_hint="--duration")
    try:
        rule = Rule(parse_rate(rate), burst)
    except Exception as exc:
        raise click.BadParameter(str(exc)) from None
    print_settings_if_asked({"duration": duration, "rate": rate, "burst": burst, "abuse": abuse})
    scenario = Scenario(rule, duration, 0.6 * rule.rate, abuse * rule.rate)
    logging.getLogger("smockron.gatekeeper").setLevel(logging.WARNING)  # the table says it all

    async def main(stop: asyncio.Event) -> None:
        """The demo, cut short (cleanly: proxies closed, master stopped) by Ctrl-C."""
        with tempfile.TemporaryDirectory(prefix="smockron-demo-") as tmp:
            work = asyncio.create_task(
                run_demo(scenario, Path(tmp) / "master.log", sys.stdout.isatty())
            )
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait({work, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not work.done():  # Ctrl-C: the runtime said it in one line; the rest is noise
                logging.getLogger("smockron.gatekeeper").setLevel(logging.ERROR)
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
                return
            lines = work.result()
        print("\n".join(lines), flush=True)

    runtime.run(main, name="demo")
