"""Accuracy of the whole system: is an abusive client held to its rule, however it sends?

Every cell of the matrix starts fresh real processes: a ``smockron master`` (history or
GCRA for the domain) and 1, 2 or 4 ``smockron proxy`` gatekeepers on the settings a user
gets by default (only the addresses, ``--identify header:X-Client`` and
``--decision-header`` are given), in front of a backend in this process that records when
each client's requests arrive. For ``--duration`` T seconds an abusive client sends one
pattern, round-robin over the proxies:

  steady    10x its rate, evenly spaced;
  bursts    20 concurrent requests every 250 ms;
  burst500  one burst of 500 concurrent requests;
  pool      50 connections, each sending again as soon as an answer comes back
            (bounded by T and a cap on requests).

Beside it a polite client sends at 0.9x its rate (its own identifier), round-robin too.

  admitted   the abusive client's arrivals at the backend within T (a request a proxy
             delays counts if it reaches the backend inside T); median of the rounds
  ideal      burst + rate x T: what the rule allows
  at once    burst500 only: arrivals within half an interval (1 / rate) of the burst's
             first arrival, vs what the rule admits at once: its burst (GCRA: burst + 1,
             the original master's formula)
  polite     polite requests slowed (delayed, rejected, or unanswered 1 s after the
             window) out of those sent, worst round

Goals: admitted <= 1.05x ideal (steady: <= 1.02x); burst500 through one gatekeeper: at
once <= 1.05x burst (through N gatekeepers each may admit its burst before it hears the
master, and the master charges the excess as debt: only the admitted goal applies);
polite slowed == 0. A row is MET when all of its goals are.

``--front nginx`` puts nginx with smockron's module (``nginx/``, built by
``scripts/build-nginx-module``; one worker, identified by X-Client) in place of each proxy.

Run: python bench/accuracy.py [--duration 8] [--rounds 3] [--patterns steady,bursts,...]
     [--gatekeepers 1,2,4] [--algorithms history,gcra] [--front proxy|nginx] [--json FILE]
The default matrix (4 patterns x 3 gatekeeper counts x 2 algorithms x 3 rounds) takes
about 13 minutes. Traffic goes to 127.0.0.1 only; every process is stopped at the end of
its cell, on an error and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

import aiohttp
from _common import free_ports, wait_port
from aiohttp import web

from smockron.core.rules import Rule, parse_rule_spec
from smockron.gatekeeper.proxy import DECISION_HEADER
from tests.support import Proc, run_smockron

PATTERNS: Final = ("steady", "bursts", "burst500", "pool")
ALGORITHMS: Final = ("history", "gcra")
GOAL: Final = 1.05
STEADY_GOAL: Final = 1.02
AT_ONCE_GOAL: Final = 1.05
FACTOR: Final = 10.0  # steady: abusive rate / rule rate
POLITE: Final = 0.9  # polite rate / rule rate
BURST_SIZE: Final = 20
BURST_EVERY_S: Final = 0.25
BIG_BURST: Final = 500
POOL_CONNECTIONS: Final = 50
POLITE_GRACE_S: Final = 1.0
SETTLE_S: Final = 1.0  # after the proxies connect: control subscriptions reach the master
READY_TIMEOUT_S: Final = 15.0
STOP_TIMEOUT_S: Final = 1.0


def at_once_s(cfg: Config) -> float:
    """Half an interval: shorter than the wait before the first request after the burst."""
    return 0.5 / cfg.rule.rate


@dataclass(frozen=True)
class Config:
    rule_spec: str
    domain: str
    rule: Rule
    duration: float
    pool_cap: int
    masters: int = 1
    """A fleet of this many peered masters; proxies follow all of them (--master)."""
    front: str = "proxy"
    """The gatekeepers: ``smockron proxy``, or nginx with smockron's module."""

    @property
    def ideal(self) -> float:
        return self.rule.burst + self.rule.rate * self.duration


@dataclass(frozen=True)
class Outcome:
    """One round of one cell."""

    admitted: int
    at_once: int | None
    abusive_sent: int
    abusive_verdicts: dict[str, int]
    polite_sent: int
    polite_slowed: int
    polite_verdicts: dict[str, int]


@dataclass
class Row:
    """One cell: a pattern through some gatekeepers on one master algorithm, all rounds."""

    pattern: str
    gatekeepers: int
    algorithm: str
    ideal: float
    burst: int
    rounds: list[Outcome] = field(default_factory=list)

    @property
    def goal(self) -> float:
        return STEADY_GOAL if self.pattern == "steady" else GOAL

    @property
    def admitted(self) -> float:
        return statistics.median(o.admitted for o in self.rounds)

    @property
    def ratio(self) -> float:
        return self.admitted / self.ideal

    @property
    def at_once(self) -> float | None:
        values = [o.at_once for o in self.rounds if o.at_once is not None]
        return statistics.median(values) if values else None

    @property
    def burst_at_once(self) -> int:
        """What the rule admits at once: its burst (GCRA: burst + 1)."""
        return self.burst + (self.algorithm == "gcra")

    @property
    def worst_polite(self) -> Outcome:
        return max(self.rounds, key=lambda o: o.polite_slowed)

    def met(self) -> bool:
        at_once = self.at_once
        return (
            self.ratio <= self.goal
            and (
                at_once is None
                or self.gatekeepers > 1
                or at_once <= AT_ONCE_GOAL * self.burst_at_once
            )
            and self.worst_polite.polite_slowed == 0
        )

    def summary(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in asdict(self).items() if k != "rounds"},
            "admitted": self.admitted,
            "ratio": round(self.ratio, 4),
            "goal": self.goal,
            "at_once": self.at_once,
            "polite_slowed": self.worst_polite.polite_slowed,
            "met": self.met(),
            "rounds": [asdict(o) for o in self.rounds],
        }


def _serve_backend(port: int, conn: Connection) -> None:
    """The backend process: answers ``ok``, records each client's arrival times, and
    sends them down ``conn`` when asked (``"arrivals"``) until told ``"stop"``."""
    arrivals: defaultdict[str, list[float]] = defaultdict(list)

    async def handle(request: web.Request) -> web.Response:
        arrivals[request.headers.get("X-Client", "")].append(time.monotonic())
        return web.Response(text="ok")

    async def serve() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
        conn.send("ready")
        while await asyncio.to_thread(conn.recv) == "arrivals":
            conn.send(dict(arrivals))
        await runner.cleanup()

    asyncio.run(serve())


class Backend:
    """The protected service, in a process of its own: answers ``ok`` and records each
    client's arrival times.

    Not in the load generator's event loop: there, a burst's 500 connections and answers
    delay the backend's handlers by a hundred milliseconds and more, so the burst's
    admitted requests were stamped late, bunched with the first delayed one that came a
    tenth of a second after them, and the count of a window was wrong. ``time.monotonic``
    is the machine's clock, the same in both processes."""

    def __init__(self) -> None:
        self.arrivals: defaultdict[str, list[float]] = defaultdict(list)
        self._conn: Connection | None = None
        self._proc: multiprocessing.process.BaseProcess | None = None

    async def start(self, port: int) -> None:
        ctx = multiprocessing.get_context("spawn")  # no fork of a running event loop
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve_backend, args=(port, child), daemon=True)
        self._proc.start()
        child.close()
        if not await asyncio.to_thread(self._conn.poll, READY_TIMEOUT_S):
            raise RuntimeError("the backend did not start")
        self._conn.recv()

    async def collect(self) -> None:
        """Fetch the arrivals so far from the backend process."""
        assert self._conn is not None
        self._conn.send("arrivals")
        self.arrivals = defaultdict(list, await asyncio.to_thread(self._conn.recv))

    async def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.send("stop")
            self._conn.close()
        if self._proc is not None:
            await asyncio.to_thread(self._proc.join, STOP_TIMEOUT_S)
            if self._proc.is_alive():
                self._proc.kill()
                await asyncio.to_thread(self._proc.join)

    def count(self, who: str, start: float, end: float) -> int:
        return sum(1 for t in self.arrivals[who] if start <= t <= end)

    def at_once(self, who: str, start: float, window: float) -> int:
        """Arrivals within ``window`` of the first one at or after ``start``: what got
        through before any verdict could slow it, however long the burst took to arrive."""
        first = min((t for t in self.arrivals[who] if t >= start), default=None)
        return 0 if first is None else self.count(who, first, first + window)


class Sender:
    """One client's requests, round-robin over the proxies, tallied by their decision."""

    def __init__(self, session: aiohttp.ClientSession, urls: list[str], who: str) -> None:
        self.session = session
        self.urls = urls
        self.who = who
        self.sent = 0
        self.verdicts: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()

    async def get(self) -> None:
        url = self.urls[self.sent % len(self.urls)]
        self.sent += 1
        verdict = "unanswered"  # stays so if cancelled at the end of the window
        try:
            async with self.session.get(url, headers={"X-Client": self.who}) as response:
                await response.read()
                verdict = response.headers.get(DECISION_HEADER, f"HTTP {response.status}")
        except (aiohttp.ClientError, TimeoutError):
            verdict = "error"
        finally:
            self.verdicts[verdict] += 1

    def spawn(self) -> None:
        """Send one request without waiting for it."""
        task = asyncio.create_task(self.get())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def finish(self, grace: float) -> None:
        """Wait up to ``grace`` seconds for requests in flight, then abandon the rest."""
        if self._tasks and grace > 0:
            await asyncio.wait(self._tasks, timeout=grace)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def slowed(self) -> int:
        return sum(n for verdict, n in self.verdicts.items() if verdict != "accept")


async def sleep_until(at: float) -> None:
    await asyncio.sleep(max(0.0, at - time.monotonic()))


async def paced(sender: Sender, t0: float, duration: float, rate: float) -> None:
    """Open loop: one request every 1/rate s, whatever the answers take."""
    for i in range(math.ceil(duration * rate)):
        await sleep_until(t0 + i / rate)
        sender.spawn()


async def steady(sender: Sender, t0: float, cfg: Config) -> None:
    await paced(sender, t0, cfg.duration, FACTOR * cfg.rule.rate)


async def bursts(sender: Sender, t0: float, cfg: Config) -> None:
    for k in range(math.ceil(cfg.duration / BURST_EVERY_S)):
        await sleep_until(t0 + k * BURST_EVERY_S)
        for _ in range(BURST_SIZE):
            sender.spawn()


async def burst500(sender: Sender, t0: float, cfg: Config) -> None:
    await sleep_until(t0)
    for _ in range(BIG_BURST):  # all tasks exist before the first one connects
        sender.spawn()


async def pool(sender: Sender, t0: float, cfg: Config) -> None:
    end = t0 + cfg.duration
    await sleep_until(t0)

    async def connection() -> None:
        while time.monotonic() < end and sender.sent < cfg.pool_cap:
            await sender.get()

    await asyncio.gather(*(connection() for _ in range(POOL_CONNECTIONS)))


Pattern = Callable[[Sender, float, Config], Awaitable[None]]
PATTERN_FUNCS: Final[dict[str, Pattern]] = {
    "steady": steady,
    "bursts": bursts,
    "burst500": burst500,
    "pool": pool,
}


def master_args(
    cfg: Config, algorithm: str, me: tuple[str, str], fleet: list[tuple[str, str]]
) -> list[str]:
    peers = [arg for acc, ctl in fleet if (acc, ctl) != me for arg in ("--peer", f"{acc},{ctl}")]
    return [
        "master",
        "--accounting",
        me[0],
        "--control",
        me[1],
        *peers,
        "--rule",
        cfg.rule_spec,
        "--algorithm",
        f"{cfg.domain}={algorithm}",
    ]


def proxy_args(cfg: Config, port: int, backend: int, fleet: list[tuple[str, str]]) -> list[str]:
    """A proxy on its defaults: only addresses, identification and the decision header."""
    if len(fleet) == 1:
        masters = ["--accounting", fleet[0][0], "--control", fleet[0][1]]
    else:
        masters = [arg for acc, ctl in fleet for arg in ("--master", f"{acc},{ctl}")]
    return [
        "proxy",
        "--listen",
        f"127.0.0.1:{port}",
        "--upstream",
        f"http://127.0.0.1:{backend}",
        "--domain",
        cfg.domain,
        *masters,
        "--identify",
        "header:X-Client",
        "--decision-header",
    ]


NGINX_CONF: Final = """
load_module {module};
worker_processes 1;
daemon off;
master_process on;
pid {dir}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fcgi; uwsgi_temp_path {dir}/uwsgi; scgi_temp_path {dir}/scgi;
    smockron_master {acc};
    smockron_control {ctl};
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            smockron on;
            smockron_domain {domain};
            smockron_identifier $http_x_client;
            add_header {header} $smockron_decision always;
            proxy_pass http://127.0.0.1:{backend};
        }}
    }}
}}
"""


def nginx_module() -> str:
    out = subprocess.run(
        [str(Path(__file__).resolve().parent.parent / "scripts" / "build-nginx-module")],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"--front nginx: the module did not build\n{out.stderr}")
    return out.stdout.strip().splitlines()[-1]


def nginx_gatekeeper(
    cfg: Config, port: int, backend: int, fleet: list[tuple[str, str]], workdir: Path
) -> Proc:
    """nginx with the module, following the one master (the module follows one)."""
    workdir.mkdir()
    conf = workdir / "nginx.conf"
    ((acc, ctl),) = fleet
    conf.write_text(
        NGINX_CONF.format(
            module=nginx_module(),
            dir=workdir,
            acc=acc,
            ctl=ctl,
            port=port,
            domain=cfg.domain,
            header=DECISION_HEADER,
            backend=backend,
        )
    )
    return Proc(["nginx", "-c", str(conf), "-e", str(workdir / "error.log")], workdir / "log")


def check_alive(procs: list[Proc]) -> None:
    for proc in procs:
        if not proc.alive():
            tail = proc.log()[-3000:]
            raise RuntimeError(f"{proc.log_path.name} exited early; its log ends:\n{tail}")


async def ready(procs: list[Proc], ports: list[int]) -> None:
    """Proxies listen and report their accounting socket connected to the master."""
    await asyncio.gather(*(asyncio.to_thread(wait_port, p, READY_TIMEOUT_S) for p in ports))
    deadline = time.monotonic() + READY_TIMEOUT_S
    proxies = [p for p in procs if "proxy" in p.log_path.name]
    nginxes = [p.log_path.parent / "error.log" for p in procs if p.log_path.name == "log"]
    while not all("accounting connected" in p.log() for p in proxies) or not all(
        log.exists() and "control connected" in log.read_text() for log in nginxes
    ):
        check_alive(procs)
        if time.monotonic() > deadline:
            break  # the log line may have changed; the settle time below still applies
        await asyncio.sleep(0.05)
    await asyncio.sleep(SETTLE_S)
    check_alive(procs)


def signal_all(procs: list[Proc], sig: int) -> None:
    for proc in procs:
        if proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, sig)


def stop_all(procs: list[Proc]) -> None:
    """SIGTERM to every process at once; SIGKILL to those still running after one shared
    grace period (a proxy holding delayed requests would wait for them)."""
    signal_all(procs, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(max(0.0, deadline - time.monotonic()))
    signal_all(procs, signal.SIGKILL)
    for proc in procs:
        proc.stop()  # reaps, closes the log


@contextlib.asynccontextmanager
async def system(
    cfg: Config, algorithm: str, gatekeepers: int, workdir: Path
) -> AsyncIterator[tuple[list[str], Backend, list[Proc]]]:
    """A fresh master (or fleet), ``gatekeepers`` proxies and a backend, stopped when the
    block ends."""
    back, *ports = free_ports(1 + gatekeepers)
    addresses = free_ports(2 * cfg.masters)
    fleet = [
        (f"tcp://127.0.0.1:{addresses[2 * i]}", f"tcp://127.0.0.1:{addresses[2 * i + 1]}")
        for i in range(cfg.masters)
    ]
    backend = Backend()
    procs: list[Proc] = []
    try:
        await backend.start(back)
        for i, me in enumerate(fleet):
            procs.append(
                run_smockron(
                    master_args(cfg, algorithm, me, fleet), workdir / f"master-{i + 1}.log"
                )
            )
        for i, port in enumerate(ports):
            if cfg.front == "nginx":
                procs.append(nginx_gatekeeper(cfg, port, back, fleet, workdir / f"nginx-{i + 1}"))
                continue
            args = proxy_args(cfg, port, back, fleet)
            procs.append(run_smockron(args, workdir / f"proxy-{i + 1}.log"))
        await ready(procs, ports)
        yield [f"http://127.0.0.1:{p}/" for p in ports], backend, procs
    finally:
        await asyncio.to_thread(stop_all, procs)
        await backend.close()


async def measure(cfg: Config, pattern: str, urls: list[str], backend: Backend) -> Outcome:
    """Run ``pattern`` and the polite client for one window; count what reached the backend."""
    connector = aiohttp.TCPConnector(limit=0)  # no client-side queue: a burst is concurrent
    timeout = aiohttp.ClientTimeout(total=cfg.duration + 30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        abusive, polite = Sender(session, urls, "abusive"), Sender(session, urls, "polite")
        t0 = time.monotonic() + 0.05
        end = t0 + cfg.duration
        traffic = asyncio.gather(
            PATTERN_FUNCS[pattern](abusive, t0, cfg),
            paced(polite, t0, cfg.duration, POLITE * cfg.rule.rate),
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(traffic, timeout=end - time.monotonic() + 0.01)
        await sleep_until(end)
        await abusive.finish(0.0)  # later arrivals do not count
        await polite.finish(POLITE_GRACE_S)
    await backend.collect()
    return Outcome(
        admitted=backend.count("abusive", t0, end),
        at_once=backend.at_once("abusive", t0, at_once_s(cfg)) if pattern == "burst500" else None,
        abusive_sent=abusive.sent,
        abusive_verdicts=dict(sorted(abusive.verdicts.items())),
        polite_sent=polite.sent,
        polite_slowed=polite.slowed(),
        polite_verdicts=dict(sorted(polite.verdicts.items())),
    )


async def run_cell(cfg: Config, row: Row) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="smockron-accuracy-") as tmp:
        async with system(cfg, row.algorithm, row.gatekeepers, Path(tmp)) as (urls, be, procs):
            outcome = await measure(cfg, row.pattern, urls, be)
            check_alive(procs)  # a crashed master fails open: the numbers would mean nothing
    return outcome


async def run_matrix(cfg: Config, rows: list[Row], rounds: int) -> None:
    """Rounds outermost, so the machine's noise spreads over every cell alike."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    for r in range(rounds):
        for row in rows:
            outcome = await run_cell(cfg, row)
            row.rounds.append(outcome)
            print(
                f"  round {r + 1}/{rounds} {row.pattern:8} {row.gatekeepers} gk "
                f"{row.algorithm:7}: admitted {outcome.admitted} / {row.ideal:g}, "
                f"at once {outcome.at_once}, abusive {outcome.abusive_verdicts}, "
                f"polite {outcome.polite_verdicts}",
                file=sys.stderr,
                flush=True,
            )


def format_table(rows: list[Row]) -> str:
    header = (
        f"{'pattern':9} {'gk':>2} {'algorithm':9} {'admitted':>8} {'ideal':>6} "
        f"{'ratio':>7} {'goal':>7} {'at once':>9} {'polite slowed':>13}  result"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        if not row.rounds:
            continue
        at_once = "-" if row.at_once is None else f"{row.at_once:g}/{row.burst_at_once}"
        polite = row.worst_polite
        lines.append(
            f"{row.pattern:9} {row.gatekeepers:2d} {row.algorithm:9} {row.admitted:8g} "
            f"{row.ideal:6g} {row.ratio:6.2f}x {'<=' + format(row.goal, '.2f') + 'x':>7} "
            f"{at_once:>9} {f'{polite.polite_slowed}/{polite.polite_sent}':>13}  "
            f"{'MET' if row.met() else 'NOT MET'}"
        )
    return "\n".join(lines)


def goals_text(cfg: Config, rounds: int) -> str:
    return (
        f"rule {cfg.rule_spec}; window T = {cfg.duration:g} s; ideal = burst + rate x T = "
        f"{cfg.ideal:g}; medians of {rounds} round(s), polite: worst round\n"
        f"goals: admitted <= {GOAL:.2f}x ideal (steady <= {STEADY_GOAL:.2f}x); burst500 "
        f"through 1 gatekeeper: at once (within {at_once_s(cfg) * 1000:g} ms of its first "
        f"arrival) <= {AT_ONCE_GOAL:.2f}x burst (GCRA: burst + 1); polite slowed == 0"
    )


def csv_choice(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in items if s not in allowed]
    if bad or not items:
        raise SystemExit(f"{flag}: expected a comma-separated subset of {','.join(allowed)}")
    return items


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--duration", type=float, default=8.0, help="window T per cell, seconds [8]")
    add("--rounds", type=int, default=3, help="rounds per cell; the table shows medians [3]")
    add("--patterns", default=",".join(PATTERNS), help="comma-separated [all]")
    add("--gatekeepers", default="1,2,4", help="proxy counts, comma-separated [1,2,4]")
    add("--algorithms", default=",".join(ALGORITHMS), help="the master's [history,gcra]")
    add("--rule", default="acc:10/s:20", help="DOMAIN:RATE/UNIT:BURST [acc:10/s:20]")
    add("--pool-cap", type=int, default=50_000, help="most requests of the pool pattern")
    add("--masters", type=int, default=1, help="a fleet of this many masters [1]")
    add("--front", choices=("proxy", "nginx"), default="proxy", help="the gatekeepers [proxy]")
    add("--json", type=Path, help="also write the rows here")
    return parser.parse_args()


def build(args: argparse.Namespace) -> tuple[Config, list[Row]]:
    if args.duration <= 0 or args.rounds < 1 or args.pool_cap < 1:
        raise SystemExit("--duration, --rounds and --pool-cap must be positive")
    domain, rule = parse_rule_spec(args.rule)
    if not 1 <= args.masters <= 8:
        raise SystemExit("--masters: between 1 and 8")
    if args.front == "nginx" and args.masters != 1:
        raise SystemExit("--front nginx follows one master: --masters 1")
    cfg = Config(args.rule, domain, rule, args.duration, args.pool_cap, args.masters, args.front)
    try:
        counts = [int(n) for n in args.gatekeepers.split(",")]
    except ValueError:
        raise SystemExit("--gatekeepers: expected counts such as 1,2,4") from None
    if not counts or min(counts) < 1 or max(counts) > 16:
        raise SystemExit("--gatekeepers: counts between 1 and 16")
    rows = [
        Row(pattern, n, algorithm, cfg.ideal, rule.burst)
        for pattern in csv_choice(args.patterns, PATTERNS, "--patterns")
        for n in counts
        for algorithm in csv_choice(args.algorithms, ALGORITHMS, "--algorithms")
    ]
    return cfg, rows


def main() -> None:
    args = parse_args()
    cfg, rows = build(args)
    print(
        f"accuracy, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{os.cpu_count()} CPUs (shared), load {os.getloadavg()[0]:.2f}; "
        f"{cfg.masters} master(s); gatekeepers: {cfg.front}; "
        f"{len(rows)} cells x {args.rounds} round(s)",
        flush=True,
    )
    interrupted = False
    try:
        asyncio.run(run_matrix(cfg, rows, args.rounds))
    except (KeyboardInterrupt, asyncio.CancelledError):
        interrupted = True
        print("\ninterrupted: the rows below hold the rounds finished so far", flush=True)
    print(goals_text(cfg, args.rounds))
    print(format_table(rows), flush=True)
    if args.json is not None:
        meta = {"rule": cfg.rule_spec, "duration": cfg.duration, "rounds": args.rounds}
        doc = {**meta, "rows": [row.summary() for row in rows if row.rounds]}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    if interrupted:
        sys.exit(130)


if __name__ == "__main__":
    main()
