"""Accounting messages per second through one `smockron master` process.

    python bench/master_throughput.py [--messages 400000] [--senders 2] [--runs 3]
        [--no-redis] [--reaction] [--memory 1000000]
    python bench/master_throughput.py --only-reaction [--reaction-runs 5]
        [--pin no|yes|both] [--trace]

``--reaction`` adds the reaction time (accounting sent -> DELAY_UNTIL received, p50 and
p99 at 1,000 and 50,000 messages/s); ``--memory N`` the bytes per tracked identifier
with N identifiers, and the pause of a full garbage collection with them stored.
``--runs 0`` (or ``--only-reaction``) skips the throughput part.

Reaction time method. A load generator process sends the bulk, every millisecond what
is owed (50 messages at 50,000/s), frame by frame through pyzmq's compiled
``Socket.send`` with pre-built frames: ~1.5 us a message, like the gatekeepers' own
compiled send path. It used ``send_multipart`` (~10 us a message) until 2026-11-23:
at 50,000/s that alone took half of one of the two cores, and the master, its ZeroMQ
I/O thread and the probe waited for a CPU; p99 was 4.3 ms with it and 0.8 ms without
it, the master unchanged. In production the gatekeepers run on other machines, so
their sending cost on the master's machine is an artefact; keeping it small measures
the master more faithfully. Each round prints how much CPU other processes (other
users of the machine) used meanwhile. ``--pin yes`` pins the master (all its threads)
to CPU 1 and the load generator and probe to CPU 0 (``both``: one round each way); it
did not help (the master's main thread then shares one core with its own I/O thread),
so the figures are unpinned. ``--trace`` runs the master with timestamps of every GC
pass, store rotation, drain and apply, prints the master threads' run-queue wait
(schedstat), and lists for each probe slower than 2 ms what the master did meanwhile.

Method, identical for every receiver measured in the same run:
1. start the receiver (a master, or the baseline: a bare pyzmq loop doing only
   ``recv_multipart()``), and the sender processes; each sender connects a PUB and
   handshakes (probe messages until the receiver answers one), so nothing is lost to
   the PUB/SUB slow joiner;
2. SIGSTOP the receiver, let the senders send everything (it waits in their queues and
   the kernel's buffers), then SIGCONT it and time until it has handled every message.
This measures the receiver's own rate with senders in other processes, without the
senders competing for the (two) CPU cores while it is measured.

Workload: 6-frame ACCEPTED messages (with a short loginfo frame, as gatekeepers send
them), 10,000 identifiers, one domain ruled ``1/m:30``; 80% of the identifiers send
20 requests each (within their burst) and 20% send 120 (over their limit), interleaved.
Timestamps are current; the master runs with a large skew tolerance so a message waiting
in a queue is accounted at its own time. The Redis variant uses a redis-server started
here on a free port.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import zmq
from _common import (  # checkout first on sys.path
    ROOT,
    cpu_seconds,
    free_port,
    full_gc_ms,
    paced_accounting,
    thread_schedstat,
)

IDENTIFIERS = 10_000
HEAVY_SHARE = 0.2
RULE = "bench:1/m:30"
LOGINFO = b"ua=bench/1.0"
"""The optional sixth frame, as gatekeepers send it (the issue's figures: 6 frames)."""


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), e.get("PYTHONPATH")]))
    return e


def workload(messages: int) -> list[tuple[bytes, int]]:
    """(identifier, count) with ~20% heavy identifiers, scaled to ``messages`` in total."""
    heavy = int(IDENTIFIERS * HEAVY_SHARE)
    light_n, heavy_n = 20, 120
    scale = messages / ((IDENTIFIERS - heavy) * light_n + heavy * heavy_n)
    return [
        (b"user-%05d" % i, max(1, round((heavy_n if i < heavy else light_n) * scale)))
        for i in range(IDENTIFIERS)
    ]


# ---------------------------------------------------------------- processes (roles)


def run_sender(acc: int, ctl: int, index: int, count: int, messages: int) -> None:
    """Role: connect, handshake, wait for "go" on stdin, send this sender's share."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.connect(f"tcp://127.0.0.1:{acc}")
    sub = ctx.socket(zmq.SUB)
    sub.subscribe(b"")
    sub.connect(f"tcp://127.0.0.1:{ctl}")
    probe = 0
    mine = b"s%d-" % index
    live = False
    while not live:  # until a DELAY_UNTIL answers one of *this* sender's probes
        probe += 1
        pub.send_multipart(
            [b"probe\0", b"ACCEPTED", mine + b"%d" % probe, b"%d" % int(time.time() * 1000), b""]
        )
        while sub.poll(100):
            if sub.recv_multipart()[2].startswith(mine):
                live = True
    print("ready", flush=True)
    sys.stdin.readline()
    share = [(ident, n) for i, (ident, n) in enumerate(workload(messages)) if i % count == index]
    send = pub.send_multipart
    sent = 0
    rounds = max(n for _, n in share)
    for r in range(rounds):
        ts = b"%d" % int(time.time() * 1000)
        for ident, n in share:
            if r < n:
                send([b"bench\0", b"ACCEPTED", ident, ts, b"", LOGINFO])
                sent += 1
    print(f"sent {sent}", flush=True)
    sys.stdin.readline()  # stay alive until the receiver has everything
    pub.close(linger=0)
    sub.close()
    ctx.term()


def run_baseline(acc: int, ctl: int, expected: int) -> None:
    """Role: the baseline, a bare recv_multipart() loop (plus answering probes first)."""
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)  # a SUB drops beyond its HWM: unbounded for the bench
    sub.subscribe(b"")
    sub.bind(f"tcp://127.0.0.1:{acc}")
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{ctl}")
    while True:  # handshake phase: answer probes until the first real message
        frames = sub.recv_multipart()
        if frames[0] != b"probe\0":
            break
        pub.send_multipart([b"probe\0", b"DELAY_UNTIL", frames[2], b"0"])
    count = 1
    recv = sub.recv_multipart
    sub.setsockopt(zmq.RCVTIMEO, 60_000)
    try:
        while count < expected:
            recv()
            count += 1
    except zmq.Again:
        print(f"lost {expected - count}", flush=True)
    else:
        print(f"done {time.time():.6f}", flush=True)
    sub.close()
    pub.close()
    ctx.term()


# ---------------------------------------------------------------- orchestration


def start_senders(acc: int, ctl: int, n: int, messages: int) -> list[subprocess.Popen[str]]:
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--role",
                "sender",
                "--acc",
                str(acc),
                "--ctl",
                str(ctl),
                "--index",
                str(i),
                "--count",
                str(n),
                "--messages",
                str(messages),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env(),
        )
        for i in range(n)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    # A master treats old messages arriving just after a gatekeeper connects as the
    # backlog of an outage and drops them (engine.BACKLOG_MS); this bench queues its
    # load while the master is stopped, so it lets that window pass first.
    time.sleep(2.2)
    return procs


def send_all(
    receiver: subprocess.Popen[bytes] | subprocess.Popen[str], senders: list[subprocess.Popen[str]]
) -> int:
    """Stop the receiver, have the senders send everything, resume it; total sent."""
    receiver.send_signal(signal.SIGSTOP)
    for p in senders:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    total = 0
    for p in senders:
        assert p.stdout is not None
        total += int(p.stdout.readline().split()[1])
    time.sleep(0.3)  # let the senders' I/O threads hand everything to the kernel
    return total


def finish(senders: list[subprocess.Popen[str]]) -> None:
    for p in senders:
        assert p.stdin is not None
        p.stdin.write("quit\n")
        p.stdin.flush()
        p.wait(30)


def measure_baseline(messages: int, n_senders: int) -> float:
    acc, ctl = free_port(), free_port()
    expected = sum(n for _, n in workload(messages))
    recv = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--role",
            "baseline",
            "--acc",
            str(acc),
            "--ctl",
            str(ctl),
            "--expected",
            str(expected),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env(),
    )
    senders: list[subprocess.Popen[str]] = []
    try:
        senders = start_senders(acc, ctl, n_senders, messages)
        total = send_all(recv, senders)
        assert total == expected, (total, expected)
        t0 = time.time()
        recv.send_signal(signal.SIGCONT)
        assert recv.stdout is not None
        word, value = recv.stdout.readline().split()
        if word != "done":
            raise RuntimeError(f"the baseline lost {value} messages")
        recv.wait(30)
        finish(senders)
        return total / (float(value) - t0)
    finally:
        for p in [recv, *senders]:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait()


def scrape_total(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith('smockron_master_messages_total{domain="bench"'):
            total += float(line.rpartition(" ")[2])
    return int(total)


def mean_batch(log_path: Path, total: int) -> str:
    """The mean batch size, from the master's last statistics line."""
    for line in reversed(log_path.read_text().splitlines()):
        if "stopped accepted=" in line and "batches=" in line:
            batches = int(line.split("batches=")[1].split()[0])
            return f"{total / max(batches, 1):.0f}"
    return "?"


def measure_master(messages: int, n_senders: int, store: str, logdir: Path) -> tuple[float, str]:
    acc, ctl, met = free_port(), free_port(), free_port()
    expected = sum(n for _, n in workload(messages))
    log_path = logdir / f"master-{time.time_ns()}.log"
    log = open(log_path, "w")  # noqa: SIM115
    master = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "smockron",
            "--log-level",
            "INFO",
            "master",
            "--accounting",
            f"tcp://127.0.0.1:{acc}",
            "--control",
            f"tcp://127.0.0.1:{ctl}",
            "--rule",
            RULE,
            "--rule",
            "probe:1/s:1",
            "--metrics",
            f"127.0.0.1:{met}",
            "--store",
            store,
            "--skew-tolerance",
            "3600",
            "--stats-interval",
            "0",
            "--queue",
            str(max(expected, 100_000)),
            "--hwm",
            "10000000",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env(),
        cwd=ROOT,
    )
    senders: list[subprocess.Popen[str]] = []
    try:
        senders = start_senders(acc, ctl, n_senders, messages)
        total = send_all(master, senders)
        sched0 = thread_schedstat(master.pid)
        t0 = time.time()
        master.send_signal(signal.SIGCONT)
        deadline = t0 + 300
        done = 0
        while time.time() < deadline:
            done = scrape_total(met)
            if done >= total:
                break
            time.sleep(0.01)
        t1 = time.time()
        threads = _sched_delta(sched0, thread_schedstat(master.pid))
        finish(senders)
        assert done >= total, f"master handled {done} of {total}"
        with urllib.request.urlopen(f"http://127.0.0.1:{met}/metrics", timeout=5) as resp:
            metric = 'smockron_master_delay_until_published_total{domain="bench"'
            published = [ln for ln in resp.read().decode().splitlines() if ln.startswith(metric)]
        rate = total / (t1 - t0)
        info = published[0].rpartition(" ")[2] if published else "?"
    finally:
        for p in senders:
            if p.poll() is None:
                p.kill()
                p.wait()
        master.send_signal(signal.SIGCONT)
        master.terminate()
        master.wait(30)
        log.close()
    return rate, (
        f"published {info}, mean batch {mean_batch(log_path, total)}, "
        f"drain {t1 - t0:.2f}s: {threads}"
    )


def start_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found")
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, f"redis://127.0.0.1:{port}/0"


def flush_redis(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()


# ---------------------------------------------------------------- reaction time, memory


def _pin(cpus: set[int] | None) -> None:
    """Pin every thread of this process to ``cpus`` (None: leave as is). Threads created
    afterwards (ZeroMQ's I/O threads) inherit the creating thread's affinity."""
    if cpus is None:
        return
    for task in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(task), cpus)


def run_loadgen(acc: int, rate: int, seconds: float, pin: str) -> None:
    """Role: send ``rate`` accounting messages/s (within their limit) for ``seconds``.

    Every millisecond it sends what is owed (50 messages at 50,000/s), frame by frame
    through pyzmq's compiled ``Socket.send`` with pre-built frames (~1.5 us a message,
    as a gatekeeper's compiled send path) instead of ``send_multipart`` (~10 us): at
    50,000/s the latter alone took half a core of the two, which the master then waited
    for."""
    _pin({int(c) for c in pin.split(",")} if pin else None)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.connect(f"tcp://127.0.0.1:{acc}")
    time.sleep(0.5)  # slow joiner: the master is running, its subscription arrives
    print("ready", flush=True)
    idents = [b"u%d" % i for i in range(10_000)]
    paced_accounting(pub, [b"bench\0"] * len(idents), idents, rate, seconds)
    pub.close(linger=1000)
    ctx.term()


def run_traced_master(argv: list[str], trace_path: str) -> None:
    """Role (``--trace``): the master with timestamps (perf_counter, the probe's clock)
    of every GC pass, store rotation and processed batch, written to ``trace_path`` on
    exit, to correlate slow probes with what the master was doing."""
    import gc
    import json

    import smockron.master.server as server
    import smockron.wire.accounting as accounting
    from smockron.cli import main as cli_main
    from smockron.master.engine import Decoded, Engine
    from smockron.master.stores.memory import MemoryTable

    events: list[tuple[str, float, float, int]] = []  # kind, start, seconds, size
    clock = time.perf_counter
    gc_start = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_start[0] = clock()
        else:
            events.append(
                (f"gc{info['generation']}", gc_start[0], clock() - gc_start[0], info["collected"])
            )

    gc.callbacks.append(on_gc)
    tick = MemoryTable.tick

    def traced_tick(self: MemoryTable, now_ms: float) -> None:
        before, size, t0 = self.started_ms, len(self), clock()
        tick(self, now_ms)
        if self.started_ms != before and before is not None:
            events.append(("rotate", t0, clock() - t0, size))

    MemoryTable.tick = traced_tick  # type: ignore[method-assign]
    apply = Engine.apply

    def traced_apply(self: Engine, decoded: Sequence[Decoded], now_ms: float) -> list[list[bytes]]:
        t0 = clock()
        out = apply(self, decoded, now_ms)
        events.append(("apply", t0, clock() - t0, len(decoded)))
        return out

    Engine.apply = traced_apply  # type: ignore[method-assign,assignment]
    drain = accounting.drain_accounting

    def traced_drain(*args: Any) -> Any:
        t0 = clock()
        out = drain(*args)
        if out[0] or out[1]:
            events.append(("drain", t0, clock() - t0, len(out[0]) + len(out[1])))
        return out

    server.drain_accounting = traced_drain  # type: ignore[attr-defined,assignment]
    sys.argv = ["smockron", *argv]
    try:
        cli_main()
    except SystemExit:
        pass
    finally:
        Path(trace_path).write_text(json.dumps(events))


def _sched_delta(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> str:
    parts = []
    for key, (run, wait) in sorted(after.items()):
        run0, wait0 = before.get(key, (0.0, 0.0))
        parts.append(
            f"{key.split('/')[0]} cpu {run - run0:.2f}s wait {(wait - wait0) * 1000:.0f}ms"
        )
    return "; ".join(parts)


def _busy_seconds() -> float:
    """CPU seconds all processes spent, from /proc/stat (all but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


PIN_MASTER = {1}
PIN_OTHERS = {0}
"""``--pin``: the master (all its threads) on CPU 1, load generator and probe on CPU 0."""


def measure_reaction(
    rate: int, seconds: float, logdir: Path, *, pin: bool = False, trace: bool = False
) -> tuple[float, float]:
    """p50 and p99 (ms) from sending an accounting message to receiving its DELAY_UNTIL,
    under ``rate`` messages/s in all: a load generator process sends the bulk (within
    its limit); this process sends 500 probes/s (domain ``probe``, burst 1: each one is
    throttled) and times each answer with one clock (perf_counter)."""
    acc, ctl = free_port(), free_port()
    log = open(logdir / f"reaction-{rate}.log", "w")  # noqa: SIM115
    trace_path = logdir / f"trace-{rate}.json"
    master_args = [
        "master",
        "--accounting",
        f"tcp://127.0.0.1:{acc}",
        "--control",
        f"tcp://127.0.0.1:{ctl}",
        "--rule",
        "bench:1000/s:1000",
        "--rule",
        "probe:1/s:1",
        "--stats-interval",
        "0",
    ]
    if trace:
        cmd = [
            sys.executable,
            __file__,
            "--role",
            "traced-master",
            "--trace-file",
            str(trace_path),
            "--",
            *master_args,
        ]
    else:
        cmd = [sys.executable, "-m", "smockron", *master_args]
    own_affinity = os.sched_getaffinity(0)
    master = subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env(),
        cwd=ROOT,
        preexec_fn=(lambda: os.sched_setaffinity(0, PIN_MASTER)) if pin else None,
    )
    if pin:
        _pin(PIN_OTHERS)  # before this process creates its ZeroMQ context (I/O thread)
    probe_rate = 500
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.connect(f"tcp://127.0.0.1:{acc}")
    sub = ctx.socket(zmq.SUB)
    sub.subscribe(b"probe\0")
    sub.connect(f"tcp://127.0.0.1:{ctl}")
    load: subprocess.Popen[str] | None = None
    try:
        while True:  # handshake
            now = b"%d" % int(time.time() * 1000)
            pub.send_multipart([b"probe\0", b"ACCEPTED", b"hello", now, b""])
            if sub.poll(100):
                break
        while sub.poll(300):
            sub.recv_multipart()
        pin_arg = ",".join(map(str, sorted(PIN_OTHERS))) if pin else ""
        load = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--role",
                "loadgen",
                "--acc",
                str(acc),
                "--rate",
                str(max(rate - probe_rate, 0)),
                "--seconds",
                str(seconds + 1),
                "--pin-cpus",
                pin_arg,
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env(),
        )
        assert load.stdout is not None and load.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # the load is flowing
        sched0 = thread_schedstat(master.pid)
        ours = (os.getpid(), master.pid, load.pid)
        busy0, own0, wall0 = (
            _busy_seconds(),
            sum(cpu_seconds(pid, gone=0.0) for pid in ours),
            time.perf_counter(),
        )
        sent: dict[bytes, float] = {}
        samples: list[tuple[float, float]] = []  # (sent at, latency ms)
        interval = 1 / probe_rate
        seq = 0

        def receive() -> None:
            frames = sub.recv_multipart()
            t0 = sent.pop(frames[2], None)
            if t0 is not None:
                samples.append((t0, (time.perf_counter() - t0) * 1000))

        start = next_send = time.perf_counter()
        while next_send - start < seconds:
            seq += 1
            ident = b"p%d" % seq
            sent[ident] = time.perf_counter()
            pub.send_multipart(
                [b"probe\0", b"ACCEPTED", ident, b"%d" % int(time.time() * 1000), b""]
            )
            next_send += interval
            while (remaining := next_send - time.perf_counter()) > 0:
                if sub.poll(max(1, int(remaining * 1000))):
                    while sub.poll(0):
                        receive()
        while sent and sub.poll(1000):
            receive()
        sched = _sched_delta(sched0, thread_schedstat(master.pid))
        own = sum(cpu_seconds(pid, gone=0.0) for pid in ours) - own0
        foreign = (_busy_seconds() - busy0 - own) / (time.perf_counter() - wall0)
        done = load.stdout.readline().strip()
        latencies = sorted(lat for _, lat in samples)
        p50 = latencies[len(latencies) // 2]
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        print(
            f"  at {rate:,} msg/s{' (pinned)' if pin else ''} (load generator: {done}): "
            f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {latencies[-1]:.2f} ms over "
            f"{len(latencies)} probes, {len(sent)} unanswered; other processes used "
            f"{max(foreign, 0.0):.0%} of a core meanwhile",
            flush=True,
        )
        if trace:
            print(f"    master threads: {sched}")
    finally:
        if load is not None and load.poll() is None:
            load.kill()
            load.wait()
        pub.close(0)
        sub.close(0)
        ctx.term()
        if pin:
            _pin(own_affinity)
        master.terminate()
        master.wait(30)
        log.close()
    if trace:
        explain_slow(samples, trace_path, start)
    return p50, p99


def explain_slow(samples: list[tuple[float, float]], trace_path: Path, start: float) -> None:
    """Print, for each probe slower than 2 ms, what the master did meanwhile."""
    import json

    if not trace_path.exists():
        print("    (no trace written)")
        return
    events = [tuple(e) for e in json.loads(trace_path.read_text())]
    kinds: dict[str, list[float]] = {}
    for kind, _t, dur, _n in events:
        kinds.setdefault(kind, []).append(dur * 1000)
    for kind, durs in sorted(kinds.items()):
        durs.sort()
        print(
            f"    {kind:7s} n={len(durs):6d} p50 {durs[len(durs) // 2]:.3f} ms "
            f"p99 {durs[int(len(durs) * 0.99)]:.3f} ms max {durs[-1]:.3f} ms"
        )
    slow = [(t0, lat) for t0, lat in samples if lat > 2.0]
    print(f"    {len(slow)} probes over 2 ms:")
    events.sort(key=lambda e: e[1])
    for t0, lat in slow[:40]:
        t1 = t0 + lat / 1000
        during = [e for e in events if e[1] < t1 and e[1] + e[2] > t0 - 0.002]
        desc = ", ".join(
            f"{k}@{(t - t0) * 1000:+.2f}:{d * 1000:.2f}ms/{n}"
            for k, t, d, n in during
            if k != "drain" or d > 0.0002
        )
        busy = sum(
            min(t + d, t1) - max(t, t0)
            for k, t, d, _ in during
            if k in ("apply", "drain") and min(t + d, t1) > max(t, t0)
        )
        print(
            f"      at {t0 - start:6.3f}s {lat:5.2f} ms (master busy {busy * 1000:.2f} ms "
            f"in apply/drain): {desc[:600]}"
        )


def measure_memory(identifiers: int) -> None:
    """Bytes per tracked identifier in memory://, for each algorithm (RSS growth)."""
    from smockron.core.rules import Rule
    from smockron.master.domains import DomainPolicy
    from smockron.master.engine import Engine
    from smockron.master.stores.memory import MemoryStore

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    for algorithm in ("history", "gcra"):
        store = MemoryStore()
        engine = Engine({"m": DomainPolicy((Rule(10.0, 10),), algorithm)}, store)
        now = int(time.time() * 1000)
        before = rss()
        for start in range(0, identifiers, 10_000):
            batch = [
                [b"m\0", b"ACCEPTED", b"user-%08d" % i, b"%d" % now, b""]
                for i in range(start, min(start + 10_000, identifiers))
            ]
            engine.process(batch, now)
        grown = rss() - before
        print(
            f"  memory://, {algorithm}: {len(store):,} identifiers tracked, "
            f"{grown / identifiers:.0f} bytes each (RSS growth, 13-byte identifiers, "
            f"one request each)"
        )
        print(
            f"  memory://, {algorithm}: full gc.collect() with them stored: "
            f"{full_gc_ms():.1f} ms (median of 5)"
        )
        del engine, store


def reaction(runs: int, seconds: float, pin: str, trace: bool) -> None:
    print(
        "reaction time, accounting sent -> DELAY_UNTIL received (memory://), "
        f"{runs} round(s) of {seconds:g} s, load {os.getloadavg()[0]:.2f}:"
    )
    modes = {"no": [False], "yes": [True], "both": [False, True]}[pin]
    p99s: dict[tuple[int, bool], list[float]] = {}
    p50s: dict[tuple[int, bool], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(runs):
            for pinned in modes:
                for rate in (1_000, 50_000):
                    p50, p99 = measure_reaction(rate, seconds, Path(tmp), pin=pinned, trace=trace)
                    p50s.setdefault((rate, pinned), []).append(p50)
                    p99s.setdefault((rate, pinned), []).append(p99)
    for (rate, pinned), values in p99s.items():
        runs_text = ", ".join(f"{v:.2f}" for v in values)
        print(
            f"median at {rate:,} msg/s{' pinned' if pinned else ''}: "
            f"p50 {statistics.median(p50s[(rate, pinned)]):.2f} ms, "
            f"p99 {statistics.median(values):.2f} ms (p99 per round: {runs_text}; "
            f"worst {max(values):.2f} ms)"
        )


def main() -> None:
    if sys.argv[1:3] == ["--role", "traced-master"]:  # --trace-file PATH -- master args
        return run_traced_master(sys.argv[6:], sys.argv[4])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", default="bench")
    ap.add_argument("--acc", type=int)
    ap.add_argument("--ctl", type=int)
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--expected", type=int)
    ap.add_argument("--messages", type=int, default=400_000)
    ap.add_argument("--senders", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-redis", action="store_true")
    ap.add_argument("--rate", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--reaction", action="store_true", help="also reaction time at 1k, 50k/s")
    ap.add_argument("--only-reaction", action="store_true", help="reaction time only")
    ap.add_argument("--reaction-runs", type=int, default=1, help="rounds of the reaction part")
    ap.add_argument("--reaction-seconds", type=float, default=5.0)
    ap.add_argument(
        "--pin",
        choices=("no", "yes", "both"),
        default="no",
        help="reaction: master on CPU 1, load and probe on CPU 0 (see docstring)",
    )
    ap.add_argument(
        "--trace",
        action="store_true",
        help="reaction: trace the master and explain each probe over 2 ms",
    )
    ap.add_argument("--pin-cpus", default="")
    ap.add_argument(
        "--memory",
        type=int,
        default=0,
        metavar="N",
        help="also bytes per identifier with N identifiers (e.g. 1000000)",
    )
    args = ap.parse_args()
    if args.role == "sender":
        return run_sender(args.acc, args.ctl, args.index, args.count, args.messages)
    if args.role == "baseline":
        return run_baseline(args.acc, args.ctl, args.expected)
    if args.role == "loadgen":
        return run_loadgen(args.acc, args.rate, args.seconds, args.pin_cpus)
    if args.only_reaction:
        args.runs, args.reaction = 0, True

    from smockron.wire.accounting import COMPILED

    if args.runs > 0:
        print(
            f"messages per run: {sum(n for _, n in workload(args.messages))}, "
            f"{IDENTIFIERS} identifiers, 20% over '{RULE}', {args.senders} sender processes, "
            f"receive loop: {'compiled' if COMPILED else 'pure Python'}"
        )
        results: dict[str, list[float]] = {"baseline": [], "memory": [], "redis": []}
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            redis_proc, redis_url = (None, "") if args.no_redis else start_redis(workdir)
            try:
                for run in range(args.runs):
                    results["baseline"].append(measure_baseline(args.messages, args.senders))
                    rate, published = measure_master(
                        args.messages, args.senders, "memory://", workdir
                    )
                    results["memory"].append(rate)
                    line = (
                        f"run {run + 1}: baseline {results['baseline'][-1]:,.0f}/s, "
                        f"master memory {rate:,.0f}/s ({published})"
                    )
                    if redis_proc is not None:
                        flush_redis(redis_url)  # each run starts from an empty store
                        rate, info = measure_master(args.messages, args.senders, redis_url, workdir)
                        results["redis"].append(rate)
                        line += f", master redis {rate:,.0f}/s ({info})"
                    print(line, flush=True)
            finally:
                if redis_proc is not None:
                    redis_proc.terminate()
                    redis_proc.wait(10)
        base = statistics.median(results["baseline"])
        mem = statistics.median(results["memory"])
        print(f"median baseline recv_multipart loop: {base:,.0f} msg/s")
        print(
            f"median master (memory://):           {mem:,.0f} msg/s  = {mem / base:.2f}x baseline"
        )
        if results["redis"]:
            red = statistics.median(results["redis"])
            share = red / mem
            print(f"median master (redis://):            {red:,.0f} msg/s  = {share:.0%} of memory")
    if args.reaction:
        reaction(args.reaction_runs, args.reaction_seconds, args.pin, args.trace)
    if args.memory:
        measure_memory(args.memory)


if __name__ == "__main__":
    main()
