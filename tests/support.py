"""Helpers for tests: free ports, waiting for servers, real server processes."""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.gatekeeper.commands import proxy_args

REPO_ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now (and port + 1 neither:
    see ``free_ports``)."""
    return free_ports(1)[0]


PORTS_FROM = 10_000
"""Test ports come from below Linux's ephemeral range (32768-60999 by default), so no
outgoing connection's local port takes one between its probe and its use."""
PORTS_PER_WORKER = 4_000
_offsets = itertools.count(random.randrange(PORTS_PER_WORKER), 2)


def _worker_block() -> int:
    """This pytest-xdist worker's block of ports (``gw2`` -> 2; 0 without xdist), so
    workers running at once never probe the same port."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) if worker[2:].isdigit() else 0


def _candidate() -> int:
    """The next port of this worker's block to probe, its port + 1 in the block too."""
    first = PORTS_FROM + (_worker_block() % 4) * PORTS_PER_WORKER
    return first + next(_offsets) % (PORTS_PER_WORKER - 1)


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1, each with port + 1 free too, none
    overlapping: a cluster node given one as its gRPC port listens for its peers on the
    next."""
    ports: list[int] = []
    for _ in range(PORTS_PER_WORKER):
        if len(ports) == n:
            return ports
        port = _candidate()
        if _bindable(port) and _bindable(port + 1):
            ports.append(port)
    raise RuntimeError(f"no {n} free port pairs in this worker's block")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.02) -> None:
    """Poll ``predicate`` until true; fail the test with a clear message on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s: {predicate}")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
        return True
    return False


def wait_port(port: int, timeout: float = 15.0) -> None:
    wait_for(lambda: port_open(port), timeout)


def smockron_env() -> dict[str, str]:
    """Environment for a CLI subprocess that imports this checkout's smockron."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


@dataclass
class Proc:
    """A CLI subprocess whose output goes to a log file shown when a test fails."""

    args: Sequence[str]
    log_path: Path
    popen: subprocess.Popen[bytes] = field(init=False)

    def __post_init__(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            list(self.args),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=smockron_env(),
            cwd=REPO_ROOT,
            start_new_session=True,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout)
        self._log.close()
        return int(self.popen.returncode)

    def kill(self) -> int:
        return self.stop(signal.SIGKILL)


class RollingKills:
    """Each master of a fleet SIGKILLed and restarted in turn, ``steps`` of
    ``(tick, "kill" | "start", index)``: a kill waits until every other master is ready
    (its warm start over: the ``warm start: `` line), as an operator's rolling restart
    waits for readiness, so the fleet never has all its masters down at once however
    slowly a loaded machine starts them; later steps move by what it waited."""

    READY = "warm start: "

    def __init__(
        self,
        procs: list[Proc],
        restart: Callable[[int], Proc],
        steps: Sequence[tuple[int, str, int]] = (
            (8, "kill", 0),
            (12, "start", 0),
            (20, "kill", 1),
            (24, "start", 1),
        ),
    ) -> None:
        self.procs = procs
        self.restart = restart
        self.steps = list(steps)
        self.waited = 0

    @property
    def done(self) -> bool:
        return not self.steps

    def at(self, tick: int) -> None:
        """Take the steps due at ``tick``."""
        while self.steps and tick >= self.steps[0][0] + self.waited:
            _, kind, which = self.steps[0]
            others = (p for i, p in enumerate(self.procs) if i != which)
            if kind == "kill" and not all(self.READY in p.log() for p in others):
                self.waited += 1
                return
            self.steps.pop(0)
            if kind == "kill":
                self.procs[which].kill()
            else:
                self.procs[which] = self.restart(which)


def master_args(
    acc: int, ctl: int, *extra: str, rules: Sequence[str] = (), metrics: int = 0
) -> list[str]:
    """``smockron master`` on loopback: its accounting and control ports, ``--rule`` for
    each of ``rules``, its metrics port when given, no stats lines unless ``extra`` asks
    (a later flag wins)."""
    return [
        "master",
        "--accounting",
        f"tcp://127.0.0.1:{acc}",
        "--control",
        f"tcp://127.0.0.1:{ctl}",
        *(arg for rule in rules for arg in ("--rule", rule)),
        *(("--metrics", f"127.0.0.1:{metrics}") if metrics else ()),
        "--stats-interval",
        "0",
        *extra,
    ]


def router_args(acc: int, ctl: int, *masters: tuple[int, int], metrics: int = 0) -> list[str]:
    """``smockron router`` on loopback: its accounting and control ports, then each
    master's, and its metrics port when given."""
    return [
        "router",
        "--accounting",
        f"tcp://127.0.0.1:{acc}",
        "--control",
        f"tcp://127.0.0.1:{ctl}",
        *(
            arg
            for m_acc, m_ctl in masters
            for arg in ("--master", f"tcp://127.0.0.1:{m_acc},tcp://127.0.0.1:{m_ctl}")
        ),
        *(("--metrics", f"127.0.0.1:{metrics}") if metrics else ()),
    ]


def run_smockron(args: Sequence[str], log_path: Path) -> Proc:
    """Start ``python -m smockron ARGS`` as a subprocess."""
    return Proc([sys.executable, "-m", "smockron", *args], log_path)


def smockron_run(args: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m smockron ARGS`` to its end, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "smockron", *args],
        capture_output=True,
        text=True,
        env=smockron_env(),
        cwd=REPO_ROOT,
        timeout=timeout,
        check=False,
    )


def cluster_args(grpc: int, http: int, *extra: str, peers: Sequence[int] = ()) -> list[str]:
    """``smockron cluster`` on loopback, serving gRPC on ``grpc`` and HTTP on ``http``;
    ``peers``: the gRPC ports of the whole cluster, itself included (none: no --peers)."""
    peer_args = ["--peers", ",".join(f"127.0.0.1:{p}" for p in peers)] if peers else []
    return [
        "cluster",
        "--grpc-address",
        f"127.0.0.1:{grpc}",
        "--http-address",
        f"127.0.0.1:{http}",
        *peer_args,
        *extra,
    ]


@dataclass
class Node:
    """One ``smockron cluster`` process."""

    grpc_address: str
    http_port: int
    proc: Proc

    @property
    def grpc_port(self) -> int:
        return int(self.grpc_address.rsplit(":", 1)[1])


@contextlib.contextmanager
def cluster_nodes(tmp: Path, *extra: str, nodes: int = 1) -> Iterator[list[Node]]:
    """``nodes`` ``smockron cluster`` processes peered by --peers, with ``extra`` flags
    (logs under ``tmp``), once they serve gRPC and HTTP; all stopped at the end."""
    ports = free_ports(2 * nodes)
    grpc_ports, http_ports = ports[:nodes], ports[nodes:]
    procs: list[Proc] = []
    with stopping(procs):
        for i, (g, h) in enumerate(zip(grpc_ports, http_ports, strict=True)):
            args = cluster_args(g, h, *extra, peers=grpc_ports)
            procs.append(run_smockron(args, tmp / f"node{i}-{g}.log"))
        for port in ports:
            wait_port(port, timeout=20)
        yield [
            Node(f"127.0.0.1:{g}", h, p)
            for g, h, p in zip(grpc_ports, http_ports, procs, strict=True)
        ]


def daemon_args(command: str) -> list[str]:
    """A command line that starts the daemon ``command`` on free loopback ports."""
    a, b, c, d = free_ports(4)
    return {
        "master": master_args(a, b, rules=["api:1/s:1"]),
        "router": router_args(a, b, (c, d)),
        "proxy": proxy_args(
            a, 9, f"tcp://127.0.0.1:{b}", f"tcp://127.0.0.1:{c}", identify=None, max_delay=None
        ),
        "cluster": cluster_args(a, b),
        "jarl": [
            "jarl",
            "--service",
            "s",
            "--requests",
            "1",
            "--period",
            "1",
            "--ip",
            "127.0.0.1",
            "--port",
            str(a),
        ],
        "dthrottle": ["dthrottle", "--listen", f"tcp:127.0.0.1:{a}"],
    }[command]


@contextlib.contextmanager
def smockron_proc(args: Sequence[str], log_path: Path) -> Iterator[Proc]:
    proc = run_smockron(args, log_path)
    try:
        yield proc
    except BaseException:
        print(f"--- log of smockron {' '.join(args)} ---\n{proc.log()}")
        raise
    finally:
        proc.stop()


@contextlib.contextmanager
def stopping(procs: list[Proc]) -> Iterator[list[Proc]]:
    """Stop every process in ``procs`` when the block ends, printing their logs first if
    it failed. The list may grow inside the block: all processes started by then stop."""
    try:
        yield procs
    except BaseException:
        for proc in procs:
            print(f"--- {proc.log_path.name} ---\n{proc.log()}")
        raise
    finally:
        for proc in procs:
            proc.stop()


def _require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise RuntimeError(f"{binary} is not installed; run scripts/test, which installs it")
    return path


@dataclass
class RedisServer:
    port: int
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                _require("redis-server"),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--dir",
                str(self.workdir),
                "--protected-mode",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(self.port)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


def start_redis(workdir: Path) -> RedisServer:
    server = RedisServer(free_port(), workdir)
    server.start()
    return server


@dataclass
class EtcdServer:
    client_port: int
    peer_port: int
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self) -> None:
        url = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.proc = subprocess.Popen(
            [
                _require("etcd"),
                "--name",
                "test",
                "--data-dir",
                str(self.workdir / "data"),
                "--listen-client-urls",
                url,
                "--advertise-client-urls",
                url,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"test={peer}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(self.client_port, 30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


def start_etcd(workdir: Path) -> EtcdServer:
    client, peer = free_ports(2)
    server = EtcdServer(client, peer, workdir)
    server.start()
    return server


def twins(python: object, compiled_twin: object | None, extension: str) -> list[Any]:
    """Parameters for a test run against a pure-Python twin and its compiled twin from
    ``extension`` (a name in smockron.compiled's registry): ids ``python`` and
    ``compiled``. Where the extension is not loaded the compiled case is skipped, visibly;
    under ``SMOCKRON_REQUIRE_COMPILED=1`` (scripts/test) it fails instead, so a test run
    cannot pass on the Python path alone."""
    from smockron import compiled

    assert extension in compiled.BY_NAME, f"{extension} is not in smockron.compiled.REGISTRY"
    params = [pytest.param(python, id="python")]
    if compiled_twin is not None:
        params.append(pytest.param(compiled_twin, id="compiled"))
    elif compiled.required():
        raise compiled.MissingCompiled(
            f"{extension} is not loaded, and {compiled.REQUIRE_ENV}=1 requires it"
        )
    else:
        why = "SMOCKRON_PURE_PYTHON=1" if compiled.pure_python() else "not built"
        skip = pytest.mark.skip(reason=f"{extension}: {why}")
        params.append(pytest.param(None, id="compiled", marks=skip))
    return params
