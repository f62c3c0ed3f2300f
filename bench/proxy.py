"""``smockron proxy`` against nginx ``proxy_pass`` + ``limit_req`` in front of the same backend.

    python bench/proxy.py [--rounds 5] [--duration 5] [--connections 32]
                          [--proxy-core 0] [--load-core 1] [--also LABEL=CHECKOUT ...]
                          [--nice -10]

Needs ``nginx`` and ``wrk`` (Debian packages of those names) and ``taskset``. Everything
listens on 127.0.0.1 only. The backend is an nginx serving a 6-byte response; in front
of it, on the proxy core, either an nginx (one worker, ``limit_req`` on the client
address at a rate no request reaches, kept-alive upstream connections) or
``smockron proxy`` (identified by address, with a running ``smockron master`` and a
rule no request reaches, so both admit every request after asking their limiter).
``wrk`` (one thread), the backend and the master share the other core. A third front,
``nginx+smockron``, is nginx with smockron's own module (``nginx/``, built by
``scripts/build-nginx-module``) in place of ``limit_req``, following the same master
(``--no-module``: not measured).

Each round runs wrk against the backend directly, through nginx and through smockron,
interleaved (``--also`` adds the proxy of another checkout, e.g. an older commit
unpacked with ``git archive``, under LABEL); the figures are the medians of the rounds:
requests/s, p50 and p99 latency, added p50 (through a proxy minus direct), the master's
CPU time per request (on the load core: the accounting a smockron front sends), and the
proxy's CPU time per request (user + system, from /proc, which is robust on a shared
machine; on a busy one, requests/s say more about the neighbours than the proxy, and
``--nice`` (negative: root only) runs everything measured ahead of them; with autogroup,
the proxies' sessions get it as their group's nice value too).

At 32 connections every front is saturated and its latency is mostly queueing (nginx +
``limit_req`` adds hundreds of microseconds there too). After each run a second wrk run
on one connection (``--one-duration`` seconds; one request at a time) measures the
latency a front adds to a request when nothing waits: its p50 and p99 minus direct's.
For that run the front is moved onto the load core, with wrk and the backend (across
two cores each request would also wait for an idle core to wake twice, which on a
virtual machine costs every front alike: about 150 us p50 on the one measured), and
the master onto the other core, as it would run elsewhere in a deployment (on the
load core its batches would hold up the request in flight: a p99 of +400 to +550 us).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from _common import (
    ROOT,
    cpu_seconds,
    free_ports,
    median,
    smockron_env,
    thread_schedstat,
    wait_port,
)

NGINX_CONF = """
{main}
worker_processes 1;
daemon off;
master_process on;
pid {dir}/{name}.pid;
error_log {dir}/{name}-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/{name}-body; proxy_temp_path {dir}/{name}-proxy;
    fastcgi_temp_path {dir}/{name}-fcgi; uwsgi_temp_path {dir}/{name}-uwsgi;
    scgi_temp_path {dir}/{name}-scgi;
    keepalive_requests 1000000;
{http}
}}
"""
"""One nginx, one worker: ``http`` is what its ``http`` block holds besides the common,
``main`` what goes before (``load_module``)."""

BACKEND = """
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{ return 200 "hello\\n"; }}
    }}
"""

FRONT = """
    limit_req_zone $binary_remote_addr zone=perip:10m rate=1000000r/s;
    upstream backend {{ server 127.0.0.1:{backend}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            limit_req zone=perip burst=1000000 nodelay;
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        }}
    }}
"""

MODULE_FRONT = """
    smockron_master tcp://127.0.0.1:{acc};
    smockron_control tcp://127.0.0.1:{ctl};
    upstream backend {{ server 127.0.0.1:{backend}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            smockron on;
            smockron_domain api;
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        }}
    }}
"""
"""nginx with smockron's module (nginx/) in place of limit_req: each request looked up
in the shared zone (the master's rules offer gives it a first line) and accounted."""

RULE = "api:1000000/s:1000"
"""A rule no request reaches: a thousand requests within a millisecond (wrk sends about
a hundred). Not a burst of a million: the history rule keeps ``burst`` timestamps per
identifier and copies them at each message, so the master's cost per message would grow
with the traffic of the whole run (8 MB a message at the end), the master would fall
behind, and drain its backlog on the load core during the runs that follow."""
NICE: list[str] = []
AUTOGROUP_NICE = 0


@dataclass
class Run:
    rps: float
    p50_us: float
    p99_us: float
    errors: float
    cpu_us: float  # the proxy's CPU time per request (0 for the direct run)
    master_us: float = 0.0  # the master's, on the load core: what accounting costs there
    one_p50_us: float = 0.0  # one connection, one request at a time: no queueing
    one_p99_us: float = 0.0


def _us(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 1, "ms": 1e3, "s": 1e6}[unit]


def wrk(port: int, core: int, connections: int, duration: float) -> tuple[float, float, float, int]:
    out = subprocess.run(
        [
            *NICE,
            "taskset",
            "-c",
            str(core),
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{duration:g}s",
            "--latency",
            f"http://127.0.0.1:{port}/",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _us(re.search(r"\s50%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    p99 = _us(re.search(r"\s99%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    socket_errors = re.search(r"Socket errors: (.*)", out)
    n = int(errors.group(1)) if errors else 0
    if socket_errors:
        n += sum(int(x) for x in re.findall(r"\d+", socket_errors.group(1)))
    return rps, p50, p99, n


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its children (nginx's master and worker)."""
    return sum(cpu_seconds(each) for each in _tree(pid))


def busy_seconds(pid: int) -> float:
    """CPU seconds of all of ``pid``'s threads, to the nanosecond (schedstat)."""
    return sum(run for run, _wait in thread_schedstat(pid).values())


def _tree(pid: int) -> list[int]:
    """``pid`` and its children (nginx's master and workers)."""
    with contextlib.suppress(OSError):
        return [pid, *map(int, Path(f"/proc/{pid}/task/{pid}/children").read_text().split())]
    return [pid]


@contextlib.contextmanager
def pinned(pid: int | None, core: int, back: int) -> Iterator[None]:
    """Every thread of ``pid`` and its children on ``core`` for a while, then on ``back``:
    the one-connection run puts a front on the load core with wrk and the backend, so a
    request's latency holds no wake-up of an idle core (on a virtual machine tens of
    microseconds each, two a request, the same for every front)."""
    if pid is None:
        yield
        return
    tree = _tree(pid)
    for each in tree:
        subprocess.run(["taskset", "-a", "-p", "-c", str(core), str(each)], capture_output=True)
    try:
        yield
    finally:
        for each in tree:
            subprocess.run(["taskset", "-a", "-p", "-c", str(back), str(each)], capture_output=True)


def settle(master: int, limit_s: float = 30.0) -> float:
    """Wait until the master is idle (under 5% of a core over 0.5 s): a front it could
    not keep up with would leave it a backlog to drain on the load core during the next
    run, slowing that run's wrk and backend. How long it took."""
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        before = busy_seconds(master)
        time.sleep(0.5)
        if busy_seconds(master) - before < 0.025:
            break
    return time.monotonic() - start


def measure(port: int, pid: int | None, master: int, args: argparse.Namespace) -> Run:
    settled = settle(master)
    if settled > 0.6:
        print(f"  (the master drained a backlog for {settled:.1f} s first)", flush=True)
    before, master_before = (tree_cpu(pid) if pid else 0.0), cpu_seconds(master)
    rps, p50, p99, errors = wrk(port, args.load_core, args.connections, args.duration)
    cpu = (tree_cpu(pid) - before) if pid else 0.0
    master_cpu = cpu_seconds(master) - master_before
    requests = rps * args.duration
    per = 1e6 / requests if requests else 0.0
    one_p50 = one_p99 = 0.0
    if args.one_duration > 0:
        with (
            pinned(pid, args.load_core, args.proxy_core),
            pinned(master, args.proxy_core, args.load_core),
        ):
            _, one_p50, one_p99, one_errors = wrk(port, args.load_core, 1, args.one_duration)
        errors += one_errors
    return Run(rps, p50, p99, errors, cpu * per if pid else 0.0, master_cpu * per, one_p50, one_p99)


@contextlib.contextmanager
def process(
    argv: list[str],
    port: int,
    env: dict[str, str] | None = None,
    stop: int = signal.SIGTERM,
    cwd: Path = ROOT,
    session: bool = False,
) -> Iterator[int]:
    """``python -m`` imports from the working directory first: ``cwd`` is the tree run.
    ``session``: a session of its own, so (with autogroup, as on most desktops and
    shared machines) its core is shared with the other sessions' processes as between
    equals, not as one of this script's many processes on both cores."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=session,
    )
    if session and AUTOGROUP_NICE and Path("/proc/sys/kernel/sched_autogroup_enabled").exists():
        # a nice value counts only inside its autogroup: the session's own group is
        # given the same one, or ``--nice`` would not reach past the other sessions
        Path(f"/proc/{proc.pid}/autogroup").write_text(str(AUTOGROUP_NICE))
    try:
        wait_port(port, timeout=15.0)
        yield proc.pid
    finally:
        proc.send_signal(stop)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def nginx_conf(tmp: str, name: str, http: str, main: str = "") -> str:
    return NGINX_CONF.format(dir=tmp, name=name, http=http.strip("\n"), main=main)


def build_module() -> Path | None:
    """smockron's nginx module, built against this nginx (None: it cannot be built)."""
    out = subprocess.run(
        [str(ROOT / "scripts" / "build-nginx-module")], capture_output=True, text=True
    )
    if out.returncode != 0:
        print(f"not measuring nginx+smockron: the module did not build\n{out.stderr}")
        return None
    return Path(out.stdout.strip().splitlines()[-1])


def nginx(
    conf: str, core: int, port: int, session: bool = False
) -> contextlib.AbstractContextManager[int]:
    return process(
        [*NICE, "taskset", "-c", str(core), "nginx", "-c", conf],
        port,
        stop=signal.SIGQUIT,
        session=session,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds of each wrk run")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument(
        "--one-duration",
        type=float,
        default=3.0,
        help="seconds of a second wrk run on one connection (latency without queueing; 0: none)",
    )
    ap.add_argument("--proxy-core", type=int, default=0)
    ap.add_argument("--load-core", type=int, default=1)
    ap.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="LABEL=CHECKOUT",
        help="also measure the smockron proxy of this source tree",
    )
    ap.add_argument("--nice", type=int, default=0, help="niceness of everything measured")
    ap.add_argument(
        "--no-module", action="store_true", help="do not measure nginx with smockron's module"
    )
    args = ap.parse_args()
    global NICE, AUTOGROUP_NICE
    NICE = ["nice", "-n", str(args.nice)] if args.nice else []
    AUTOGROUP_NICE = args.nice
    for tool in ("nginx", "wrk", "taskset"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed (apt-get install nginx wrk util-linux)")
    back, front, proxy, acc, ctl, moduled, *others = free_ports(6 + len(args.also))
    module = None if args.no_module else build_module()
    env = dict(smockron_env(), SMOCKRON_LOG_LEVEL="WARNING")
    pin_load = [*NICE, "taskset", "-c", str(args.load_core)]
    pin_proxy = [*NICE, "taskset", "-c", str(args.proxy_core)]
    with tempfile.TemporaryDirectory(prefix="smockron-bench-proxy-") as tmp:
        backend_conf, front_conf = Path(tmp, "backend.conf"), Path(tmp, "front.conf")
        backend_conf.write_text(nginx_conf(tmp, "backend", BACKEND.format(port=back)))
        front_conf.write_text(nginx_conf(tmp, "front", FRONT.format(port=front, backend=back)))
        module_conf = Path(tmp, "module.conf")
        module_conf.write_text(
            nginx_conf(
                tmp,
                "module",
                MODULE_FRONT.format(port=moduled, backend=back, acc=acc, ctl=ctl),
                main=f"load_module {module};",
            )
        )
        master = [
            *pin_load,
            sys.executable,
            "-m",
            "smockron",
            "master",
            "--accounting",
            f"tcp://127.0.0.1:{acc}",
            "--control",
            f"tcp://127.0.0.1:{ctl}",
            "--rule",
            RULE,
            "--stats-interval",
            "0",
        ]

        def smockron(port: int) -> list[str]:
            return [
                *pin_proxy,
                sys.executable,
                "-m",
                "smockron",
                "proxy",
                "--listen",
                f"127.0.0.1:{port}",
                "--upstream",
                f"http://127.0.0.1:{back}",
                "--domain",
                "api",
                "--accounting",
                f"tcp://127.0.0.1:{acc}",
                "--control",
                f"tcp://127.0.0.1:{ctl}",
                "--rule",
                RULE,
                "--stats-interval",
                "0",
            ]

        with contextlib.ExitStack() as stack:
            stack.enter_context(nginx(str(backend_conf), args.load_core, back))
            targets: dict[str, tuple[int, int | None]] = {"direct": (back, None)}
            targets["nginx"] = (
                front,
                stack.enter_context(nginx(str(front_conf), args.proxy_core, front, session=True)),
            )
            master_pid = stack.enter_context(process(master, ctl, env))
            if module is not None:
                targets["nginx+smockron"] = (
                    moduled,
                    stack.enter_context(
                        nginx(str(module_conf), args.proxy_core, moduled, session=True)
                    ),
                )
            also = (spec.partition("=") for spec in args.also)
            trees = [("smockron", ROOT), *((name, Path(tree).resolve()) for name, _, tree in also)]
            for (label, root), port in zip(trees, [proxy, *others], strict=True):
                tree_env = dict(env, PYTHONPATH=str(root))
                targets[label] = (
                    port,
                    stack.enter_context(
                        process(smockron(port), port, tree_env, cwd=root, session=True)
                    ),
                )
            time.sleep(1.0)  # the proxies' control subscriptions reach the master
            for port, _pid in targets.values():  # warm up: connections, pools, caches
                wrk(port, args.load_core, args.connections, 2)
            runs: dict[str, list[Run]] = {name: [] for name in targets}
            for i in range(args.rounds):
                for name, (port, pid) in targets.items():
                    runs[name].append(measure(port, pid, master_pid, args))
                print(
                    f"round {i + 1}: "
                    + "; ".join(
                        f"{name} {r[-1].rps:,.0f} req/s p50 {r[-1].p50_us:.0f} us p99 "
                        f"{r[-1].p99_us:.0f} us"
                        + (f" {r[-1].cpu_us:.1f} us CPU" if r[-1].cpu_us else "")
                        + f" (master {r[-1].master_us:.1f} us)"
                        + (f"; 1 conn p50 {r[-1].one_p50_us:.0f} us" if r[-1].one_p50_us else "")
                        for name, r in runs.items()
                    ),
                    flush=True,
                )
    report(runs, args)


def report(runs: dict[str, list[Run]], args: argparse.Namespace) -> None:
    med = {
        name: Run(*(median([getattr(r, f) for r in rs]) for f in Run.__dataclass_fields__))
        for name, rs in runs.items()
    }
    direct = med["direct"]
    print(
        f"\nmedians of {args.rounds} rounds, wrk -t1 -c{args.connections} -d{args.duration:g}s, "
        f"proxy on core {args.proxy_core}, wrk + backend + master on core {args.load_core} "
        f"({os.cpu_count()} cores)"
    )
    print(
        f"{'':15} {'req/s':>9} {'p50 us':>8} {'p99 us':>8} {'added p50':>10} "
        f"{'CPU us/req':>10} {'master us':>9} {'errors':>7}"
    )
    for name, r in med.items():
        added = f"{r.p50_us - direct.p50_us:+.0f} us" if name != "direct" else ""
        cpu = f"{r.cpu_us:.1f}" if name != "direct" else ""
        print(
            f"{name:15} {r.rps:9,.0f} {r.p50_us:8.0f} {r.p99_us:8.0f} {added:>10} "
            f"{cpu:>10} {r.master_us:9.1f} {r.errors:7.0f}"
        )
    if args.one_duration > 0:
        print(
            f"\none connection, one request at a time (wrk -t1 -c1 -d{args.one_duration:g}s): "
            "the latency a front adds without queueing"
        )
        print(f"{'':15} {'p50 us':>8} {'p99 us':>8} {'added p50':>10} {'added p99':>10}")
        for name, r in med.items():
            gap50 = gap99 = ""
            if name != "direct":
                gap50 = f"{r.one_p50_us - direct.one_p50_us:+.0f} us"
                gap99 = f"{r.one_p99_us - direct.one_p99_us:+.0f} us"
            print(f"{name:15} {r.one_p50_us:8.0f} {r.one_p99_us:8.0f} {gap50:>10} {gap99:>10}")
    n = med["nginx"]
    print()
    for name, r in med.items():
        if name not in ("direct", "nginx"):
            print(
                f"{name} / nginx (limit_req): {r.rps / n.rps:.2f}x requests/s, "
                f"{r.cpu_us / n.cpu_us:.1f}x CPU per request; on a core of its own: "
                f"{1e6 / r.cpu_us:,.0f} requests/s "
                f"at most, nginx {1e6 / n.cpu_us:,.0f}"
            )


if __name__ == "__main__":
    main()
