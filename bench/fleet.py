"""A fleet of masters: drain rate, verdict time, kill-and-restart, and a model at scale.

    python bench/fleet.py [--part drain,verdict,kill,model] [--rounds 3]
        [--messages 200000] [--rates 1000,10000,30000] [--seconds 4] [--capacity-only]
        [--pin]

Every process runs on 127.0.0.1 and stops by itself; every load loop is bounded in
messages and in time. Ratios are against a baseline measured in the same run; figures
are medians of ``--rounds`` rounds.

drain
    One domain (``api``, ``1/m:30``), 10,000 identifiers (80% send 20 requests each,
    within their burst; 20% send 120). Two sender processes each connect one PUB to every
    master and publish as a fleet gatekeeper does: each message on its identifier's shard
    topic (:func:`smockron.core.shards.shard_topic`) with the accounting frames. The
    masters are SIGSTOPped, everything is sent (it waits in ZeroMQ's pipes and the
    kernel's buffers), then they are SIGCONTed together and the time until each has
    processed its share (its /metrics: the messages of its shards) is the drain time.
    Configurations: one master fed on the domain's own topic (the baseline), two masters
    at ``--replicas 1`` (capacity), two at ``--replicas 2`` (redundancy), four at
    ``--replicas 2``. CPU per message is the masters' CPU time (utime + stime, all
    threads) during the drain over the requests drained. One master also drains a
    polite load (every identifier within its burst, no verdict published): the
    difference gives the CPU of one DELAY_UNTIL. With ``--pin`` every master (all its
    threads) is started under ``taskset`` on a core of its own (master i on core i mod
    the CPU count), the baseline master too: each master has one core, as masters on
    machines of their own would; the senders and this process are not pinned.

verdict
    An offered load (a load generator process, shard topics, every request within its
    rule) plus 500 probes a second from this process, each a new identifier of the domain
    ``probe`` (``1/s:1``: each probe gets a DELAY_UNTIL); the time from a probe's send to
    the first DELAY_UNTIL for it on any master's control socket (what a gatekeeper
    obeys), p50 and p99, for one master and a fleet of two.

kill
    Two masters, two library gatekeepers in this process (``masters=[a, b]``), an abuser
    sending bursts of 20 every 250 ms over both (``api:20/s:20``) and a polite client
    (one request per tick); each master SIGKILLed and restarted in turn, the next kill
    once the restarted master is ready (as in tests/fleet/test_fleet_e2e.py). Printed:
    admitted / (burst + rate x T), the polite client's slowed requests, requests that
    failed (raised). Meanwhile a probe every
    20 ms (a new identifier of ``probe:1/s:1`` on its shard topic to both masters) is
    timed to its first DELAY_UNTIL from either: the longest wait is the longest gap in
    verdicts through the kills and restarts.

model
    From the drain's per-message costs: a fleet carrying one domain at 5 million
    requests a second for 1,000 gatekeepers, 8 to 64 masters at replicas 2: per request
    messages, bytes, master CPU; masters needed; the control fan-out per gatekeeper.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import zmq
from _common import ROOT, cpu_seconds, free_ports, paced_accounting, smockron_env

from smockron.core.shards import owned, owners, shard_of, shard_topic

T = TypeVar("T")
IDENTIFIERS = 10_000
HEAVY_SHARE = 0.2
DOMAIN = b"api\0"
DRAIN_RULE = "api:1/m:30"
LOGINFO = b"ua=bench/1.0"
PROBE_RATE = 500
REQUESTS_PER_S = 5_000_000
GATEKEEPERS = 1_000
FANOUT = 16
"""Control subscribers of the drain's fan-out measurement."""


# ---------------------------------------------------------------- masters


@dataclass
class MasterProc:
    acc: str
    ctl: str
    metrics: int
    popen: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]
    shards: frozenset[int] = field(default_factory=frozenset)

    @property
    def name(self) -> str:
        return self.acc

    def scrape(self) -> dict[str, float]:
        """The master's counters for ``api``: messages (all statuses), published,
        dropped, late."""
        url = f"http://127.0.0.1:{self.metrics}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        out = {"messages": 0.0, "published": 0.0, "dropped": 0.0, "late": 0.0}
        for line in text.splitlines():
            if 'domain="api"' not in line or line.startswith("#"):
                continue
            value = float(line.rpartition(" ")[2])
            if line.startswith("smockron_master_messages_total"):
                out["messages"] += value
            elif line.startswith("smockron_master_delay_until_published_total"):
                out["published"] += value
            elif line.startswith("smockron_master_dropped_total"):
                out["dropped"] += value
            elif line.startswith("smockron_master_late_total"):
                out["late"] += value
        return out

    def ready(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.metrics}/readyz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except (OSError, http.client.HTTPException):
            return False

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGCONT)
            self.popen.terminate()
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.log.close()


def pinned(pid: int) -> set[int]:
    """The cores any thread of ``pid`` may run on: what ``--pin`` promised, checked."""
    cores: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        cores |= os.sched_getaffinity(int(task.name))
    return cores


@contextlib.contextmanager
def fleet(
    n: int,
    replicas: int,
    rules: Sequence[str],
    logdir: Path,
    extra: Sequence[str] = (),
    pin: bool = False,
) -> Iterator[list[MasterProc]]:
    """``n`` master processes naming each other (``n == 1``: one master alone), stopped
    at the end; with ``pin`` master k and every thread it starts bound to core k mod the
    CPU count."""
    cpus = os.cpu_count() or 1
    ports = free_ports(3 * n)
    addrs = [
        (f"tcp://127.0.0.1:{ports[3 * k]}", f"tcp://127.0.0.1:{ports[3 * k + 1]}") for k in range(n)
    ]
    masters: list[MasterProc] = []
    env = dict(smockron_env())
    try:
        for k, (acc, ctl) in enumerate(addrs):
            args = [
                *(["taskset", "-c", str(k % cpus)] if pin else []),
                sys.executable,
                "-m",
                "smockron",
                "--log-level",
                "INFO",
                "master",
                "--accounting",
                acc,
                "--control",
                ctl,
                "--metrics",
                f"127.0.0.1:{ports[3 * k + 2]}",
                "--stats-interval",
                "0",
                *extra,
            ]
            for rule in rules:
                args += ["--rule", rule]
            if n > 1:
                args += ["--replicas", str(replicas)]
                for j, (pacc, pctl) in enumerate(addrs):
                    if j != k:
                        args += ["--peer", f"{pacc},{pctl}"]
            log_path = logdir / f"master-{k}-{time.time_ns()}.log"
            log = open(log_path, "wb")  # noqa: SIM115 - closed in MasterProc.stop
            popen = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            others = [a for j, (a, _c) in enumerate(addrs) if j != k]
            mine = owned(acc, others, replicas) if n > 1 else frozenset(range(64))
            masters.append(MasterProc(acc, ctl, ports[3 * k + 2], popen, log_path, log, mine))
        deadline = time.monotonic() + 20
        while not all(m.ready() for m in masters):
            if time.monotonic() > deadline:
                raise RuntimeError("masters not ready within 20 s")
            time.sleep(0.05)
        for k, m in enumerate(masters):
            if pin and pinned(m.popen.pid) != {k % cpus}:
                raise RuntimeError(f"master {k} not pinned: {pinned(m.popen.pid)}")
        yield masters
    finally:
        for m in masters:
            m.stop()


# ---------------------------------------------------------------- load


def workload(messages: int, polite: bool = False) -> list[tuple[bytes, int]]:
    """(identifier, requests): 20% heavy (over ``1/m:30``) unless ``polite``."""
    heavy = 0 if polite else int(IDENTIFIERS * HEAVY_SHARE)
    light_n, heavy_n = 20, 120
    scale = messages / ((IDENTIFIERS - heavy) * light_n + heavy * heavy_n)
    return [
        (b"user-%05d" % i, max(1, round((heavy_n if i < heavy else light_n) * scale)))
        for i in range(IDENTIFIERS)
    ]


def accounting(ident: bytes, ts: bytes, sharded: bool) -> list[bytes]:
    """A gatekeeper's ACCEPTED message: on the shard topic (a fleet gatekeeper) or the
    domain's topic (one master)."""
    head = shard_topic(shard_of(ident), DOMAIN) if sharded else DOMAIN
    return [head, b"ACCEPTED", ident, ts, b"", LOGINFO]


def connect_gatekeeper(
    ctx: zmq.Context[Any], accs: Sequence[str], ctls: Sequence[str], topics: Sequence[bytes]
) -> tuple[zmq.Socket[bytes], list[zmq.Socket[bytes]]]:
    """One PUB to every master (unbounded queue), one SUB per master's control."""
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.setsockopt(zmq.LINGER, 0)
    for acc in accs:
        pub.connect(acc)
    subs = []
    for ctl in ctls:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.setsockopt(zmq.LINGER, 0)
        for t in topics:
            sub.subscribe(t)
        sub.connect(ctl)
        subs.append(sub)
    return pub, subs


def handshake(
    pub: zmq.Socket[bytes], subs: list[zmq.Socket[bytes]], mark: bytes, timeout: float = 20.0
) -> None:
    """Probe (domain ``probe``, on its own topic: every master takes it) until every
    master answered one of ours: our connection and its subscriptions are up."""
    heard = [False] * len(subs)
    deadline = time.monotonic() + timeout
    n = 0
    while not all(heard):
        if time.monotonic() > deadline:
            silent = [i for i, h in enumerate(heard) if not h]
            raise RuntimeError(f"no answer from masters {silent}")
        n += 1
        pub.send_multipart(
            [b"probe\0", b"ACCEPTED", mark + b"%d" % n, b"%d" % int(time.time() * 1000), b""]
        )
        time.sleep(0.1)
        for k, sub in enumerate(subs):
            while sub.poll(0):
                if sub.recv_multipart()[2].startswith(mark):
                    heard[k] = True


def run_sender(
    accs: list[str],
    ctls: list[str],
    index: int,
    count: int,
    messages: int,
    sharded: bool,
    polite: bool,
) -> None:
    """Role: connect, handshake, wait for "go" on stdin, send this sender's share."""
    ctx: zmq.Context[Any] = zmq.Context()
    pub, subs = connect_gatekeeper(ctx, accs, ctls, [b"probe\0"])
    handshake(pub, subs, b"s%d-" % index)
    print("ready", flush=True)
    sys.stdin.readline()
    share = [
        (ident, n) for i, (ident, n) in enumerate(workload(messages, polite)) if i % count == index
    ]
    heads = {ident: accounting(ident, b"", sharded)[0] for ident, _n in share}
    send = pub.send_multipart
    sent = 0
    for r in range(max(n for _, n in share)):
        ts = b"%d" % int(time.time() * 1000)
        for ident, n in share:
            if r < n:
                send([heads[ident], b"ACCEPTED", ident, ts, b"", LOGINFO])
                sent += 1
    print(f"sent {sent}", flush=True)
    sys.stdin.readline()  # alive until the masters have everything
    pub.close(0)
    for sub in subs:
        sub.close(0)
    ctx.term()


def run_subscribers(ctl: str, count: int) -> None:
    """Role: ``count`` gatekeepers' control sockets on one master (``api``), received by
    ZeroMQ's I/O thread into unbounded queues and never read: the master's cost of
    publishing to them is measured, not ours of reading."""
    ctx: zmq.Context[Any] = zmq.Context()
    subs = []
    for _ in range(count):
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.setsockopt(zmq.LINGER, 0)
        sub.subscribe(DOMAIN)
        sub.connect(ctl)
        subs.append(sub)
    time.sleep(1.0)  # subscriptions up
    print("ready", flush=True)
    sys.stdin.readline()
    for sub in subs:
        sub.close(0)
    ctx.term()


def spawn(role: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--role", role, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=smockron_env(),
        cwd=ROOT,
    )


def tell(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def hear(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


# ---------------------------------------------------------------- drain


def retried(what: Callable[[], T], tries: int = 3) -> T:
    """``what()``, again on a failure: a port picked free can be taken by another process
    of this shared machine before our master binds it."""
    for attempt in range(tries):
        try:
            return what()
        except Exception as exc:
            if attempt == tries - 1:
                raise
            print(f"    (attempt failed: {type(exc).__name__}: {str(exc)[:120]}; again)")
    raise AssertionError("unreachable")


@dataclass
class Drain:
    rate: float  # requests drained per second (each request counted once)
    cpu_per_request_us: float  # the masters' CPU over the requests
    cpu_per_message_us: float  # ... over the messages processed (replicas x requests)
    processed: int
    published: int
    cpu_share: float  # the masters' CPU over the wall time (cores busy)
    busiest_us: float  # the busiest master's CPU over the requests


def drain_once(
    n: int,
    replicas: int,
    messages: int,
    logdir: Path,
    polite: bool = False,
    senders: int = 2,
    subscribers: int = 0,
    pin: bool = False,
) -> Drain:
    load = workload(messages, polite)
    total = sum(c for _, c in load)
    extra = [
        "--skew-tolerance",
        "3600",
        "--queue",
        str(max(2 * total, 100_000)),
        "--hwm",
        "10000000",
    ]
    with fleet(n, replicas, [DRAIN_RULE, "probe:1/s:1"], logdir, extra, pin) as masters:
        expected = [sum(c for ident, c in load if shard_of(ident) in m.shards) for m in masters]
        accs = ",".join(m.acc for m in masters)
        ctls = ",".join(m.ctl for m in masters)
        helpers = [
            spawn("subscribers", "--ctls", masters[0].ctl, "--count", str(subscribers))
            for _ in range(1 if subscribers else 0)
        ]
        procs = [
            spawn(
                "sender",
                "--accs",
                accs,
                "--ctls",
                ctls,
                "--index",
                str(i),
                "--count",
                str(senders),
                "--messages",
                str(messages),
                *(["--sharded"] if n > 1 else []),
                *(["--polite"] if polite else []),
            )
            for i in range(senders)
        ]
        try:
            for p in helpers + procs:
                if hear(p) != "ready":
                    raise RuntimeError("a sender did not connect")
            # a master takes old messages just after a connection for an outage's
            # backlog (engine.BACKLOG_MS): let that window pass before queuing
            time.sleep(2.2)
            for m in masters:
                m.popen.send_signal(signal.SIGSTOP)
            for p in procs:
                tell(p, "go")
            sent = sum(int(hear(p).split()[1]) for p in procs)
            assert sent == total, (sent, total)
            time.sleep(0.3)  # the senders' I/O threads hand everything to the kernel
            cpu0 = [cpu_seconds(m.popen.pid) for m in masters]
            t0 = time.monotonic()
            for m in masters:
                m.popen.send_signal(signal.SIGCONT)
            done = [False] * n
            counts: list[dict[str, float]] = [{} for _ in masters]
            ends = [t0] * n
            cpus = list(cpu0)
            while not all(done) and time.monotonic() - t0 < 120:
                for k, m in enumerate(masters):
                    if done[k]:
                        continue
                    counts[k] = m.scrape()
                    if counts[k]["messages"] >= expected[k]:
                        done[k] = True
                        ends[k] = time.monotonic()
                        cpus[k] = cpu_seconds(m.popen.pid)
                time.sleep(0.01)
            if not all(done):
                raise RuntimeError(f"drain incomplete: {counts} of {expected}")
            wall = max(ends) - t0
            for c in counts:
                if c["dropped"] or c["late"]:
                    print(f"    (a master dropped {c['dropped']:.0f}, late {c['late']:.0f})")
        finally:
            for p in helpers + procs:
                if p.poll() is None:
                    with contextlib.suppress(OSError):
                        tell(p, "quit")
            for p in helpers + procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    cpu = sum(cpus) - sum(cpu0)
    processed = int(sum(c["messages"] for c in counts))
    busiest = max(c1 - c0 for c0, c1 in zip(cpu0, cpus, strict=True))
    return Drain(
        total / wall,
        cpu / total * 1e6,
        cpu / processed * 1e6,
        processed,
        int(sum(c["published"] for c in counts)),
        cpu / wall,
        busiest / total * 1e6,
    )


DRAIN_CONFIGS = [
    ("one master", 1, 1),
    ("2 masters, replicas 1", 2, 1),
    ("2 masters, replicas 2", 2, 2),
    ("4 masters, replicas 2", 4, 2),
]


def bench_drain(
    rounds: int, messages: int, logdir: Path, capacity_only: bool = False, pin: bool = False
) -> dict[str, float]:
    where = (
        "each master pinned to a core of its own (i mod CPUs), senders unpinned"
        if pin
        else "nothing pinned"
    )
    print(
        f"drain: {sum(c for _, c in workload(messages)):,} requests (10,000 identifiers, "
        f"20% over {DRAIN_RULE!r}), 2 sender processes, {rounds} round(s); {where}",
        flush=True,
    )
    results: dict[str, list[Drain]] = {}
    for r in range(rounds):
        for label, n, replicas in DRAIN_CONFIGS[:2] if capacity_only else DRAIN_CONFIGS:
            d = retried(lambda: drain_once(n, replicas, messages, logdir, pin=pin))  # noqa: B023
            results.setdefault(label, []).append(d)
            print(
                f"  round {r + 1}, {label}: {d.rate:,.0f} req/s, {d.cpu_per_request_us:.2f} "
                f"us CPU/request, {d.cpu_per_message_us:.2f} us/message, "
                f"{d.processed:,} processed, {d.published:,} published, "
                f"{d.cpu_share:.2f} cores busy; load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
        if capacity_only:
            continue
        d = retried(lambda: drain_once(1, 1, messages, logdir, polite=True, pin=pin))
        results.setdefault("one master, polite", []).append(d)
        print(
            f"  round {r + 1}, one master, polite load: {d.rate:,.0f} req/s, "
            f"{d.cpu_per_request_us:.2f} us CPU/request, {d.published:,} published",
            flush=True,
        )
        d = retried(lambda: drain_once(1, 1, messages, logdir, subscribers=FANOUT, pin=pin))
        results.setdefault(f"one master, {FANOUT} subscribers", []).append(d)
        print(
            f"  round {r + 1}, one master with {FANOUT} control subscribers: {d.rate:,.0f} "
            f"req/s, {d.cpu_per_request_us:.2f} us CPU/request, {d.published:,} published",
            flush=True,
        )
    med = {
        label: (
            statistics.median(x.rate for x in ds),
            statistics.median(x.cpu_per_request_us for x in ds),
            statistics.median(x.cpu_per_message_us for x in ds),
            statistics.median(x.published for x in ds),
            statistics.median(x.processed for x in ds),
            statistics.median(x.cpu_share for x in ds),
            statistics.median(x.busiest_us for x in ds),
        )
        for label, ds in results.items()
    }
    base_rate, base_cpu = med["one master"][0], med["one master"][1]
    base_busiest = med["one master"][6]
    print(
        "drain, medians (capacity: requests per CPU-second of the busiest master, i.e. "
        "the drain rate if each master had a core of its own):"
    )
    for label, (rate, cpu_req, cpu_msg, published, _processed, share, busiest) in med.items():
        print(
            f"  {label:32s} {rate:9,.0f} req/s = {rate / base_rate:.2f}x one master; "
            f"CPU {cpu_req:.2f} us/request = {cpu_req / base_cpu:.2f}x, "
            f"{cpu_msg:.2f} us/message processed; capacity {1e6 / busiest:9,.0f} req/s = "
            f"{base_busiest / busiest:.2f}x; {published:,.0f} published; "
            f"{share:.2f} cores busy"
        )
    if capacity_only:
        return {"per_message_us": 0.0, "per_verdict_us": 0.0, "per_copy_us": 0.0}
    polite = med["one master, polite"]
    std = med["one master"]
    per_msg = polite[2]
    # the standard load's CPU beyond what its messages cost at the polite rate, over
    # the DELAY_UNTILs it published
    extra = std[2] * std[4] - polite[2] * std[4]
    per_verdict = max(0.0, extra / std[3]) if std[3] else 0.0
    fan = med[f"one master, {FANOUT} subscribers"]
    # the same load with FANOUT subscribers more: their cost over what was sent to them
    per_copy = max(0.0, (fan[2] - std[2]) * std[4] / (std[3] * FANOUT)) if std[3] else 0.0
    print(
        f"  per accounting message at a master (polite load): {per_msg:.2f} us CPU; "
        f"per DELAY_UNTIL published: {per_verdict:.2f} us CPU more; per DELAY_UNTIL per "
        f"control subscriber: {per_copy:.3f} us"
    )
    return {"per_message_us": per_msg, "per_verdict_us": per_verdict, "per_copy_us": per_copy}


# ---------------------------------------------------------------- verdict time


def run_loadgen(accs: list[str], ctls: list[str], rate: int, seconds: float, sharded: bool) -> None:
    """Role: ``rate`` requests/s (within their rule) on shard topics for ``seconds``,
    every millisecond what is owed, frame by frame through the compiled send."""
    ctx: zmq.Context[Any] = zmq.Context()
    pub, subs = connect_gatekeeper(ctx, accs, ctls, [b"probe\0"])
    handshake(pub, subs, b"load-")
    print("ready", flush=True)
    idents = [b"u%d" % i for i in range(IDENTIFIERS)]
    paced_accounting(pub, [accounting(i, b"", sharded)[0] for i in idents], idents, rate, seconds)
    pub.close(1000)
    for sub in subs:
        sub.close(0)
    ctx.term()


def verdict_once(
    n: int, replicas: int, rate: int, seconds: float, logdir: Path
) -> tuple[float, float, int]:
    """p50, p99 (ms) from a probe's send to its first DELAY_UNTIL, and unanswered."""
    with fleet(n, replicas, ["api:1000/s:1000", "probe:1/s:1"], logdir) as masters:
        ctx: zmq.Context[Any] = zmq.Context()
        pub, subs = connect_gatekeeper(
            ctx, [m.acc for m in masters], [m.ctl for m in masters], [b"probe\0"]
        )
        load: subprocess.Popen[str] | None = None
        try:
            handshake(pub, subs, b"hello-")
            for sub in subs:
                while sub.poll(300):
                    sub.recv_multipart()
            load = spawn(
                "loadgen",
                "--accs",
                ",".join(m.acc for m in masters),
                "--ctls",
                ",".join(m.ctl for m in masters),
                "--rate",
                str(max(rate - PROBE_RATE, 0)),
                "--seconds",
                str(seconds + 1),
                *(["--sharded"] if n > 1 else []),
            )
            if hear(load) != "ready":
                raise RuntimeError("the load generator did not connect")
            time.sleep(0.5)
            poller = zmq.Poller()
            for sub in subs:
                poller.register(sub, zmq.POLLIN)
            sent: dict[bytes, float] = {}
            latencies: list[float] = []
            seq = 0
            start = next_send = time.perf_counter()
            while next_send - start < seconds:
                seq += 1
                ident = b"p%d" % seq
                head = shard_topic(shard_of(ident), b"probe\0") if n > 1 else b"probe\0"
                sent[ident] = time.perf_counter()
                pub.send_multipart([head, b"ACCEPTED", ident, b"%d" % int(time.time() * 1000), b""])
                next_send += 1 / PROBE_RATE
                while (remaining := next_send - time.perf_counter()) > 0:
                    for sock, _ev in poller.poll(max(1, int(remaining * 1000))):
                        while sock.poll(0):
                            t0 = sent.pop(sock.recv_multipart()[2], None)
                            if t0 is not None:
                                latencies.append((time.perf_counter() - t0) * 1000)
            end = time.perf_counter() + 1.0
            while sent and time.perf_counter() < end:
                for sock, _ev in poller.poll(100):
                    while sock.poll(0):
                        t0 = sent.pop(sock.recv_multipart()[2], None)
                        if t0 is not None:
                            latencies.append((time.perf_counter() - t0) * 1000)
            hear(load)
        finally:
            if load is not None and load.poll() is None:
                load.kill()
                load.wait()
            pub.close(0)
            for sub in subs:
                sub.close(0)
            ctx.term()
    latencies.sort()
    if not latencies:
        return float("nan"), float("nan"), len(sent)
    return (
        latencies[len(latencies) // 2],
        latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        len(sent),
    )


def bench_verdict(rounds: int, rates: list[int], seconds: float, logdir: Path) -> None:
    print(
        f"verdict time (probe sent -> first DELAY_UNTIL), {PROBE_RATE} probes/s for "
        f"{seconds:g} s, {rounds} round(s):",
        flush=True,
    )
    configs = [
        ("one master", 1, 1),
        ("2 masters, replicas 2", 2, 2),
        ("2 masters, replicas 1", 2, 1),
    ]
    res: dict[tuple[str, int], list[tuple[float, float, int]]] = {}
    for r in range(rounds):
        for rate in rates:
            for label, n, replicas in configs:
                out = retried(lambda: verdict_once(n, replicas, rate, seconds, logdir))  # noqa: B023
                res.setdefault((label, rate), []).append(out)
                print(
                    f"  round {r + 1}, {rate:,}/s, {label}: p50 {out[0]:.2f} ms, "
                    f"p99 {out[1]:.2f} ms, {out[2]} unanswered",
                    flush=True,
                )
    print("verdict time, medians:")
    for rate in rates:
        base = statistics.median(x[1] for x in res["one master", rate])
        for label, _n, _r in configs:
            xs = res[label, rate]
            p50 = statistics.median(x[0] for x in xs)
            p99 = statistics.median(x[1] for x in xs)
            print(
                f"  {rate:7,}/s {label:24s} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms "
                f"({p99 / base:.2f}x one master's p99); unanswered "
                f"{max(x[2] for x in xs)} at most"
            )


# ---------------------------------------------------------------- kill and restart


class ProbeClock:
    """Verdict time through kills: in a thread, a new identifier of the domain ``probe``
    (``1/s:1``: each gets a DELAY_UNTIL) every ``every`` s, published on its shard topic
    to every master (``ZMQ_IMMEDIATE``: nothing queued for a dead one), timed to its first
    DELAY_UNTIL from any master. The longest wait is the longest gap in verdicts a
    gatekeeper saw, kills and restarts included."""

    def __init__(self, accs: Sequence[str], ctls: Sequence[str], every: float = 0.02) -> None:
        import threading

        self.every = every
        self.waits: list[float] = []
        self.unanswered = 0
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.IMMEDIATE, 1)
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.subscribe(b"probe\0")
        for acc, ctl in zip(accs, ctls, strict=True):
            self._pub.connect(acc)
            self._sub.connect(ctl)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        time.sleep(0.5)  # subscriptions up both ways

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        sent: dict[bytes, float] = {}
        seq = 0
        next_send = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_send:
                seq += 1
                ident = b"k%d" % seq
                sent[ident] = now
                self._pub.send_multipart(
                    [
                        shard_topic(shard_of(ident), b"probe\0"),
                        b"ACCEPTED",
                        ident,
                        b"%d" % int(time.time() * 1000),
                        b"",
                    ]
                )
                next_send += self.every
            while self._sub.poll(max(0, int((next_send - time.monotonic()) * 1000))):
                t0 = sent.pop(self._sub.recv_multipart()[2], None)
                if t0 is not None:
                    self.waits.append(time.monotonic() - t0)
        time.sleep(0.5)
        while self._sub.poll(0):
            t0 = sent.pop(self._sub.recv_multipart()[2], None)
            if t0 is not None:
                self.waits.append(time.monotonic() - t0)
        self.unanswered = len(sent)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self._pub.close(0)
        self._sub.close(0)
        self._ctx.term()


def kill_once(logdir: Path) -> tuple[float, int, int, float, int]:
    """admitted / allowed, polite slowed, failed requests, the longest wait for a
    verdict (s) and probes never answered (:class:`ProbeClock`)."""
    from smockron.gatekeeper import Gatekeeper, Verdict
    from tests.support import Proc, RollingKills, run_smockron, stopping

    rate, burst = 20.0, 20
    rules = [f"api:{int(rate)}/s:{burst}", "probe:1/s:1"]
    ports = free_ports(4)
    a = (f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[1]}")
    b = (f"tcp://127.0.0.1:{ports[2]}", f"tcp://127.0.0.1:{ports[3]}")

    def master(me: tuple[str, str], peer: tuple[str, str], name: str) -> Proc:
        return run_smockron(
            [
                "master",
                "--accounting",
                me[0],
                "--control",
                me[1],
                "--peer",
                ",".join(peer),
                "--rule",
                rules[0],
                "--rule",
                rules[1],
                "--stats-interval",
                "0",
            ],
            logdir / f"{name}-{time.time_ns()}.log",
        )

    def ready(gk: Gatekeeper) -> bool:
        return (
            all(c.up > 0 for c in gk._controls) and gk.master_connected and bool(gk.decider.lines)
        )

    admitted = slowed = failed = 0
    with stopping([]) as procs:
        procs += [master(a, b, "a"), master(b, a, "b")]
        gks = [Gatekeeper(None, None, ["api"], masters=[a, b], max_delay_ms=0) for _ in range(2)]
        clock = ProbeClock([a[0], b[0]], [a[1], b[1]])
        try:
            deadline = time.monotonic() + 20
            while not all(map(ready, gks)):
                if time.monotonic() > deadline:
                    raise RuntimeError("gatekeepers not ready within 20 s")
                time.sleep(0.05)
            kills = RollingKills(procs, lambda k: master(*((a, b) if k == 0 else (b, a)), "ab"[k]))
            clock.start()
            start = time.monotonic()
            for tick in range(48):  # 12 s
                kills.at(tick)
                for i in range(20):
                    try:
                        admitted += gks[i % 2].decide(b"api", b"abuser").verdict is Verdict.ACCEPT
                    except Exception:
                        failed += 1
                try:
                    slowed += gks[tick % 2].decide(b"api", b"polite").verdict is not Verdict.ACCEPT
                except Exception:
                    failed += 1
                time.sleep(max(0.0, start + (tick + 1) * 0.25 - time.monotonic()))
            window = time.monotonic() - start
            if not kills.done:
                raise RuntimeError(f"a restarted master was not ready in time: {kills.steps}")
        finally:
            clock.close()
            for gk in gks:
                gk.close()
    longest = max(clock.waits, default=float("nan"))
    return admitted / (burst + rate * window), slowed, failed, longest, clock.unanswered


def bench_kill(rounds: int, logdir: Path) -> None:
    print(
        f"kill and restart: 2 masters, 2 gatekeepers, bursts of 20 every 250 ms for 12 s "
        f"('api:20/s:20'), each master SIGKILLed and restarted in turn (the next kill once "
        f"the restarted one is ready), {rounds} round(s)",
        flush=True,
    )
    out = []
    for r in range(rounds):
        ratio, slowed, failed, wait, lost = retried(lambda: kill_once(logdir))
        out.append((ratio, slowed, failed, wait))
        print(
            f"  round {r + 1}: admitted {ratio:.3f} of (burst + rate x T), polite slowed "
            f"{slowed}, failed {failed}; probes every 20 ms: longest wait for a verdict "
            f"{wait * 1000:.0f} ms, {lost} unanswered",
            flush=True,
        )
    print(
        f"kill and restart, medians: admitted {statistics.median(x[0] for x in out):.3f} of "
        f"(burst + rate x T) (worst {max(x[0] for x in out):.3f}), polite slowed "
        f"{statistics.median(x[1] for x in out):.0f}, failed "
        f"{statistics.median(x[2] for x in out):.0f}, longest wait for a verdict "
        f"{statistics.median(x[3] for x in out) * 1000:.0f} ms (worst "
        f"{max(x[3] for x in out) * 1000:.0f} ms)"
    )


# ---------------------------------------------------------------- model


def zmtp_bytes(frames: Sequence[bytes]) -> int:
    """Bytes of one message on a ZMTP 3 connection: per frame a flags byte, a size (1
    byte, 8 above 255) and the body (no CURVE: it adds 33 bytes a frame)."""
    return sum(2 + len(f) if len(f) < 256 else 9 + len(f) for f in frames)


def most_loaded(n: int, replicas: int) -> float:
    """The largest share of the shards one master of ``n`` holds (the ring is not
    perfectly even), as a multiple of the even share ``replicas / n``."""
    names = [f"tcp://10.0.{k // 250}.{k % 250 + 1}:10004" for k in range(n)]
    held: dict[str, int] = dict.fromkeys(names, 0)
    for holders in owners(names, replicas).values():
        for name in holders:
            held[name] += 1
    return max(held.values()) / (64 * min(replicas, n) / n)


THROTTLED = 0.01
"""The model's share of requests that get a verdict (a DELAY_UNTIL)."""
CORE_BUDGET = 0.7
"""A master (one Python process, one core for its loop) planned at 70% of a core."""


def bench_model(per_message_us: float, per_verdict_us: float, per_copy_us: float) -> None:
    ident = b"user-00000123"  # 13 bytes
    ts = b"%d" % int(time.time() * 1000)
    acc_b = zmtp_bytes(accounting(ident, ts, True)[:5])  # no loginfo frame
    ver_b = zmtp_bytes([DOMAIN, b"DELAY_UNTIL", ident, ts])
    replicas, rps, gks = 2, REQUESTS_PER_S, GATEKEEPERS
    verdicts = rps * THROTTLED
    print(
        f"model: one domain at {rps:,} requests/s through {gks:,} gatekeepers, replicas "
        f"{replicas}, {THROTTLED:.0%} of requests throttled (each gets a DELAY_UNTIL); "
        f"costs measured above: {per_message_us:.2f} us of master CPU per accounting "
        f"message, {per_verdict_us:.2f} us per DELAY_UNTIL published, {per_copy_us:.3f} us "
        f"per DELAY_UNTIL per control subscriber; {acc_b} bytes per accounting message, "
        f"{ver_b} per DELAY_UNTIL (ZMTP frames, 13-byte identifier, no loginfo, "
        "no CURVE)"
    )
    per_req_cpu = replicas * (per_message_us + THROTTLED * (per_verdict_us + gks * per_copy_us))
    print(
        f"  per request: {replicas} accounting messages ({replicas * acc_b} bytes), "
        f"{replicas * THROTTLED * gks:.0f} control messages "
        f"({replicas * THROTTLED * gks * ver_b:.0f} bytes), master CPU {per_req_cpu:.2f} us "
        f"= accounting {replicas * per_message_us:.2f} + verdicts "
        f"{replicas * THROTTLED * per_verdict_us:.2f} + fan-out "
        f"{replicas * THROTTLED * gks * per_copy_us:.2f}"
    )
    print(
        "  masters | busiest master: shards x even, msg/s in, | fleet CPU | control out of "
        "the fleet | control into each gatekeeper"
    )
    print(
        "          | CPU (cores: accounting + fan-out)        | (cores)   | (msg/s, Gbit/s)  "
        "        | (msg/s, Mbit/s)"
    )
    for n in (8, 16, 32, 64):
        skew = most_loaded(n, replicas)
        share = replicas / n * skew  # of the domain's requests, at the busiest master
        acc_in = rps * share
        cpu_acc = acc_in * per_message_us / 1e6
        cpu_fan = verdicts * share * (per_verdict_us + gks * per_copy_us) / 1e6
        fleet_cpu = rps * per_req_cpu / 1e6
        out = verdicts * replicas * gks
        into = verdicts * replicas
        print(
            f"  {n:7d} | {skew:.2f}x, {acc_in:10,.0f}, {cpu_acc:5.2f} + {cpu_fan:5.2f} = "
            f"{cpu_acc + cpu_fan:5.2f} | {fleet_cpu:9.1f} | {out / 1e6:6.0f} M, "
            f"{out * ver_b * 8 / 1e9:6.1f}         | {into:9,.0f}, "
            f"{into * ver_b * 8 / 1e6:6.1f}"
        )
    holder_us = per_message_us + THROTTLED * (per_verdict_us + gks * per_copy_us)
    even = rps * per_req_cpu / 1e6 / CORE_BUDGET
    print(
        f"  a domain's {64} shards cap one shard's load at {rps / 64:,.0f} requests/s = "
        f"{rps / 64 * holder_us / 1e6:.2f} cores at each of its {replicas} holders; with "
        f"perfectly even shards {even:.0f} masters at {CORE_BUDGET:.0%} of a core would "
        f"carry {rps:,} requests/s; the ring's unevenness makes the busiest master the "
        f"limit:"
    )
    for n in (8, 16, 32, 64):
        cap = CORE_BUDGET / (replicas / n * most_loaded(n, replicas) * holder_us / 1e6)
        print(
            f"    {n:2d} masters carry {cap:12,.0f} requests/s of one domain "
            f"({cap / rps:.0%} of {rps:,})"
        )


# ---------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", default="bench")
    ap.add_argument("--accs", default="")
    ap.add_argument("--ctls", default="")
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--sharded", action="store_true")
    ap.add_argument("--polite", action="store_true")
    ap.add_argument("--rate", type=int, default=0)
    ap.add_argument("--part", default="drain,verdict,kill,model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--rates", default="1000,10000,30000")
    ap.add_argument(
        "--capacity-only",
        action="store_true",
        help="drain: one master and two at replicas 1 only (no cost runs)",
    )
    ap.add_argument(
        "--pin",
        action="store_true",
        help="drain: each master on a core of its own (master i on core i mod CPUs)",
    )
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument(
        "--per-message-us",
        type=float,
        default=0.0,
        help="model without the drain: CPU per accounting message",
    )
    ap.add_argument(
        "--per-verdict-us",
        type=float,
        default=0.0,
        help="model without the drain: CPU per DELAY_UNTIL",
    )
    ap.add_argument(
        "--per-copy-us",
        type=float,
        default=0.0,
        help="model without the drain: CPU per DELAY_UNTIL per subscriber",
    )
    args = ap.parse_args()
    accs, ctls = args.accs.split(","), args.ctls.split(",")
    if args.role == "sender":
        return run_sender(
            accs, ctls, args.index, args.count, args.messages, args.sharded, args.polite
        )
    if args.role == "subscribers":
        return run_subscribers(ctls[0], args.count)
    if args.role == "loadgen":
        return run_loadgen(accs, ctls, args.rate, args.seconds, args.sharded)
    parts = set(args.part.split(","))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop our masters on the way out
    print(
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
        f"{os.uname().release}, load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    costs = {
        "per_message_us": args.per_message_us,
        "per_verdict_us": args.per_verdict_us,
        "per_copy_us": args.per_copy_us,
    }
    with tempfile.TemporaryDirectory() as tmp:
        logdir = Path(tmp)
        if "drain" in parts:
            costs = bench_drain(args.rounds, args.messages, logdir, args.capacity_only, args.pin)
        if "verdict" in parts:
            bench_verdict(
                args.rounds, [int(r) for r in args.rates.split(",")], args.seconds, logdir
            )
        if "kill" in parts:
            bench_kill(args.rounds, logdir)
    if "model" in parts:
        if not costs["per_message_us"]:
            raise SystemExit("model: run with the drain part, or give --per-message-us")
        bench_model(costs["per_message_us"], costs["per_verdict_us"], costs["per_copy_us"])


if __name__ == "__main__":
    main()
