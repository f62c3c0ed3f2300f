"""Real ``smockron cluster`` processes started with envoyproxy/ratelimit's environment.

``upstream_node(env)`` starts a node in envoyproxy/ratelimit mode on free ports, with the
runtime directory of upstream's integration test (copied, so tests may edit it) unless
``RUNTIME_ROOT`` is given; ``StatsdListener`` is a real TCP statsd server that sums the
counters it is sent and keeps the gauges' last values and the timers' values. Sentinel and
Redis Cluster come from tests/master/test_redis_urls.py.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from smockron.cluster.envoy.pb import ratelimit_pb2, rls_pb2, rls_pb2_grpc
from tests.master.test_redis_urls import cluster, sentinel  # noqa: F401 - fixtures
from tests.support import (
    Proc,
    RedisServer,
    free_ports,
    run_smockron,
    start_redis,
    stopping,
    wait_for,
    wait_port,
)

UPSTREAM = Path(__file__).parent / "upstream"


@dataclass
class UpstreamNode:
    proc: Proc
    runtime: Path
    """``RUNTIME_ROOT/RUNTIME_SUBDIRECTORY``: ``config/`` and upstream's ``reload.yaml``."""
    grpc_port: int
    http_port: int
    debug_port: int
    env: dict[str, str]
    gateway_port: int = 0
    """smockron's own HTTP gateway (``--http-address``: ``/metrics``)."""

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def stub(self, channel: grpc.aio.Channel) -> rls_pb2_grpc.RateLimitServiceStub:
        return rls_pb2_grpc.RateLimitServiceStub(channel)  # type: ignore[no-untyped-call]


def request(
    domain: str, descriptors: list[list[tuple[str, str]]], hits: int = 1
) -> rls_pb2.RateLimitRequest:
    """Upstream's ``common.NewRateLimitRequest``."""
    out = rls_pb2.RateLimitRequest(domain=domain, hits_addend=hits)
    for entries in descriptors:
        d = ratelimit_pb2.RateLimitDescriptor()
        for key, value in entries:
            d.entries.add(key=key, value=value)
        out.descriptors.append(d)
    return out


def copy_runtime(tmp_path: Path) -> Path:
    """Upstream's ``runtime/current/ratelimit`` under ``tmp_path``; returns its path."""
    runtime = tmp_path / "runtime" / "current" / "ratelimit"
    shutil.copytree(UPSTREAM / "integration_runtime", runtime)
    return runtime


StartNode = Callable[..., UpstreamNode]


@pytest.fixture
def upstream_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StartNode]:
    """``start(env, runtime=None, wait=True)``: a node; every one started is stopped."""
    procs: list[Proc] = []
    runtime_default = copy_runtime(tmp_path)

    def start(
        env: dict[str, str], runtime: Path | None = None, wait: bool = True, name: str = "node"
    ) -> UpstreamNode:
        runtime = runtime or runtime_default
        grpc_port, http_port, debug_port = free_ports(3)
        full = {
            "RUNTIME_ROOT": str(runtime.parent),
            "RUNTIME_SUBDIRECTORY": runtime.name,
            "GRPC_HOST": "127.0.0.1",
            "GRPC_PORT": str(grpc_port),
            "HOST": "127.0.0.1",
            "PORT": str(http_port),
            "DEBUG_HOST": "127.0.0.1",
            "DEBUG_PORT": str(debug_port),
            "USE_STATSD": "false",
            "SMOCKRON_CLUSTER_ENVOY_RELOAD_INTERVAL": "100ms",
            **env,
        }
        for key in ("SMOCKRON_CLUSTER_ENVOY_CONFIG", "SMOCKRON_LOG_LEVEL", "SMOCKRON_LOG_FORMAT"):
            monkeypatch.delenv(key, raising=False)
        for key, value in full.items():
            monkeypatch.setenv(key, value)
        http_gateway = free_ports(1)[0]
        proc = run_smockron(
            ["cluster", "--http-address", f"127.0.0.1:{http_gateway}"],
            tmp_path / f"{name}-{len(procs)}.log",
        )
        procs.append(proc)
        node = UpstreamNode(
            proc,
            runtime,
            int(full["GRPC_PORT"]),
            int(full["PORT"]),
            int(full["DEBUG_PORT"]),
            full,
            http_gateway,
        )
        if wait:
            wait_port(node.http_port)
            wait_for(lambda: "serving" in proc.log() or not proc.alive(), timeout=30)
            assert proc.alive(), proc.log()
        for key in full:
            monkeypatch.delenv(key, raising=False)
        return node

    with stopping(procs):
        yield start


@dataclass
class StatsdListener:
    """A TCP statsd server on 127.0.0.1: sums ``name:value|c`` lines, keeps the last
    ``|g`` value and every ``|ms`` value per name."""

    port: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    gauges: dict[str, int] = field(default_factory=dict)
    timers: dict[str, list[float]] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    _sock: socket.socket | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(8)
        self.port = sock.getsockname()[1]
        self._sock = sock
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        assert self._sock is not None
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buffer += data
                *complete, buffer = buffer.split(b"\n")
                for raw in complete:
                    self._line(raw.decode())

    def _line(self, line: str) -> None:
        if not line:
            return
        name, _, rest = line.partition(":")
        value, _, kind = rest.partition("|")
        with self._lock:
            self.lines.append(line)
            if kind == "c":
                self.counters[name] = self.counters.get(name, 0) + int(value)
            elif kind == "g":
                self.gauges[name] = int(value)
            elif kind == "ms":
                self.timers.setdefault(name, []).append(float(value))

    def get(self, name: str) -> int:
        with self._lock:
            return self.counters.get(name, 0)

    def times(self, name: str) -> list[float]:
        with self._lock:
            return list(self.timers.get(name, []))

    def gauges_under(self, prefix: str) -> dict[str, int]:
        """The last values of the gauges named ``prefix...``, by the rest of their name."""
        with self._lock:
            return {
                n.removeprefix(prefix): v for n, v in self.gauges.items() if n.startswith(prefix)
            }

    def count(self, prefix: str) -> int:
        """The lines received whose name starts with ``prefix``."""
        with self._lock:
            return sum(1 for line in self.lines if line.startswith(prefix))

    def stop(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()


@pytest.fixture
def statsd_listener() -> Iterator[StatsdListener]:
    listener = StatsdListener()
    listener.start()
    try:
        yield listener
    finally:
        listener.stop()


@pytest.fixture
def per_second_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A second real Redis, for upstream's per-second limits (REDIS_PERSECOND)."""
    server = start_redis(tmp_path_factory.mktemp("redis-persecond"))
    try:
        yield server
    finally:
        server.stop()
