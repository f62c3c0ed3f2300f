"""Soak every smockron listener in hostile input, with valid checks in between.

For each listener a real daemon is started (``python -m smockron ...`` on 127.0.0.1)
and sent ``--messages`` fuzzed messages from ``bench/fuzz.py`` (or as many as fit in
``--seconds``); every ``--check-every`` messages a valid request is made and its answer
verified. Reported per listener: messages sent, rate, valid checks passed, RSS of the
daemon before and after, whether it is alive at the end, and its log lines about bad
input. Listeners: master accounting (ZeroMQ), proxy control (a fake master publishing
on the address the proxy subscribes to), DThrottle (TCP lines), JARL (TCP connections,
from many loopback source addresses), cluster HTTP gateway, cluster gRPC.

Run: python bench/soak.py [--messages 1000000] [--seconds 120] [--only master,jarl]
``tests/test_soak.py`` runs the same code at 10,000 messages per listener.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import http.server
import json
import random
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "bench"):  # the repository (tests.support), this folder (fuzz)
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import fuzz  # noqa: E402
import zmq  # noqa: E402

from tests.support import Proc, free_ports, run_smockron, wait_for, wait_port  # noqa: E402

LOG_BAD_INPUT = re.compile(
    r"malformed|bad request|ignoring|closing connection|dropped|do not decode", re.I
)


def now_ms() -> int:
    return int(time.time() * 1000)


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise LookupError(f"no VmRSS for pid {pid}")


def scrape(port: int, prefix: str) -> float:
    """The sum of the Prometheus samples at 127.0.0.1:``port`` whose name starts with
    ``prefix`` (every label)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith(prefix) and not line.startswith("#")
    )


def last_count(proc: Proc, pattern: str) -> float:
    """The number ``pattern`` (a regex with one group) captures in the daemon's newest
    statistics line that has it; waits up to 3 s for one (they come every 0.5 s)."""
    regex = re.compile(pattern)
    deadline = time.monotonic() + 3
    while True:
        found = regex.findall(proc.log())
        if found or time.monotonic() > deadline:
            return float(found[-1]) if found else -1.0
        time.sleep(0.1)


class Target(Protocol):
    """One listener under soak: a daemon, a way to fuzz it and a way to check it."""

    proc: Proc

    def fuzz(self, rng: random.Random) -> None: ...

    def check(self, k: int) -> bool: ...

    def counters(self) -> dict[str, float]:
        """The daemon's own counters of bad input, read before it stops."""
        ...

    def close(self) -> None: ...


@dataclass
class Result:
    listener: str
    sent: int
    seconds: float
    checks: int
    checks_ok: int
    rss_before: int
    rss_after: int
    alive: bool
    bad_input_lines: int
    counters: dict[str, float]
    resent: int
    """Valid checks sent again because the first copy was lost (see the targets)."""
    log: bytes

    def row(self) -> str:
        mb = 1 << 20
        return (
            f"| {self.listener} | {self.sent:,} | {self.seconds:.1f} | "
            f"{self.sent / max(self.seconds, 1e-9):,.0f} | {self.checks_ok}/{self.checks} | "
            f"{self.rss_before / mb:.1f} | {self.rss_after / mb:.1f} | "
            f"{'yes' if self.alive else 'NO'} | {self.bad_input_lines} | {self.resent} |"
        )


HEADER = (
    "| listener | fuzzed messages | s | msg/s | valid checks ok | RSS before MB "
    "| RSS after MB | alive | bad-input log lines | checks resent |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def soak(
    target: Target, messages: int, seconds: float, check_every: int, seed: int, name: str
) -> Result:
    """Fuzz ``target`` with ``messages`` (at most ``seconds``), checking it in between."""
    rng = random.Random(seed)
    pid = target.proc.popen.pid
    before = rss_bytes(pid)
    checks = ok = sent = 0
    start = time.monotonic()
    deadline = start + seconds
    while sent < messages and time.monotonic() < deadline:
        for _ in range(min(check_every, messages - sent)):
            target.fuzz(rng)
            sent += 1
        checks += 1
        ok += target.check(checks)
    elapsed = time.monotonic() - start
    time.sleep(0.3)  # let the last of the queue be processed before RSS is read
    alive = target.proc.alive()
    after = rss_bytes(pid) if alive else 0
    log = target.proc.log_path.read_bytes()
    lines = sum(
        1 for line in log.decode("utf-8", "replace").splitlines() if LOG_BAD_INPUT.search(line)
    )
    counters = target.counters() if alive else {}
    resent = getattr(target, "resent", 0)
    return Result(
        name, sent, elapsed, checks, ok, before, after, alive, lines, counters, resent, log
    )


LINE_START = re.compile(rb"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|smockron \w+: ")
"""How every line a daemon writes starts: the logger's timestamp, or the banner a CLI
prints (``smockron cluster: node ... serving``)."""


def forged_lines(log: bytes) -> list[bytes]:
    """Log lines hostile input could have made: lines that do not start as the logger
    (or the CLI banner) starts them, say after a raw newline or CR from the input (the
    fuzz writes ``FORGED`` after each), and lines with a raw ESC or NUL byte. A log
    record that spans lines, or a traceback, shows here too: one record, one line."""
    return [
        line
        for line in log.splitlines()
        if line and (not LINE_START.match(line) or b"\x1b" in line or b"\x00" in line)
    ]


# --- master accounting --------------------------------------------------------------


class MasterTarget:
    """``smockron master``; fuzz on its accounting SUB; checks: a fresh identifier's
    ACCEPTED under ``api:1/s:1`` gets its DELAY_UNTIL (receive time + 1 s)."""

    def __init__(self, workdir: Path) -> None:
        from tests.master.client import FakeGatekeeper

        acc, ctl, self.metrics = free_ports(3)
        self.proc = run_smockron(
            [
                "master",
                "--accounting",
                f"tcp://127.0.0.1:{acc}",
                "--metrics",
                f"127.0.0.1:{self.metrics}",
                "--control",
                f"tcp://127.0.0.1:{ctl}",
                "--stats-interval",
                "0",
                "--rule",
                "api:1/s:1",
                "--rule",
                "probe:1/s:1",
            ],
            workdir / "master.log",
        )
        self.gk = FakeGatekeeper(acc, ctl)
        self.gk.handshake()
        # a frame past the master's limit makes libzmq drop its connection: those go on
        # a connection of their own, so the rest is not lost with it
        self.huge = self.gk.ctx.socket(zmq.PUB)
        self.huge.setsockopt(zmq.LINGER, 0)
        self.huge.connect(f"tcp://127.0.0.1:{acc}")
        self.now = now_ms()
        self.resent = 0

    def fuzz(self, rng: random.Random) -> None:
        frames = fuzz.accounting(rng, b"api", self.now)
        if max(map(len, frames)) > 65_536:
            self.huge.send_multipart(frames)
        else:
            self.gk.send(frames)

    def check(self, k: int) -> bool:
        """A message the master does get must be answered exactly; one lost (a frame
        past the master's limit makes libzmq drop the connection and what was queued
        on it) is sent again under a new identifier, at most 3 times (``resent``)."""
        for attempt in range(3):
            self.now = now_ms()
            ident = b"valid-%d-%d" % (k, attempt)
            self.gk.accepted("api", ident, self.now)
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                got = self.gk._control(0.5)
                if got is not None and got.identifier == ident:
                    return got.until_ms == self.now + 1000
            self.resent += 1
        return False

    def counters(self) -> dict[str, float]:
        return {"malformed": scrape(self.metrics, "smockron_master_malformed_total")}

    def close(self) -> None:
        self.huge.close()
        self.gk.close()


# --- proxy control --------------------------------------------------------------------


class _Upstream(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        pass


class ProxyTarget:
    """``smockron proxy``, subscribed to a PUB this bench binds (a fake master); fuzz
    there. Checks: a fresh client passes (200); after a DELAY_UNTIL a minute ahead for
    it, it is refused (503)."""

    def __init__(self, workdir: Path) -> None:
        listen, ctl, acc = free_ports(3)
        self.upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
        threading.Thread(target=self.upstream.serve_forever, daemon=True).start()
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(f"tcp://127.0.0.1:{ctl}")
        up = self.upstream.server_address[1]
        self.proc = run_smockron(
            [
                "proxy",
                "--listen",
                f"127.0.0.1:{listen}",
                "--upstream",
                f"http://127.0.0.1:{up}",
                "--domain",
                "api",
                "--accounting",
                f"tcp://127.0.0.1:{acc}",
                "--control",
                f"tcp://127.0.0.1:{ctl}",
                "--identify",
                "header:X-Client",
                "--no-master-rules",
                "--stats-interval",
                "0.5",
            ],
            workdir / "proxy.log",
        )
        wait_port(listen)
        self.http = http.client.HTTPConnection("127.0.0.1", listen, timeout=10)
        self.now = now_ms()
        self.resent = 0
        # the SUB joins late: publish until a DELAY_UNTIL takes effect
        wait_for(lambda: self._blocked(b"joined", publish=True), timeout=15)

    def _status(self, client: bytes) -> int:
        self.http.request("GET", "/", headers={"X-Client": client.decode()})
        resp = self.http.getresponse()
        resp.read()
        return resp.status

    def _blocked(self, client: bytes, publish: bool) -> bool:
        if publish:
            self.pub.send_multipart([b"api\0", b"DELAY_UNTIL", client, b"%d" % (now_ms() + 60_000)])
            time.sleep(0.01)
        return self._status(client) == 503

    def fuzz(self, rng: random.Random) -> None:
        frames = fuzz.control(rng, b"api", self.now)
        if not frames[0].startswith(b"api\0"):  # past the subscription, to the decoder
            frames[0] = b"api\0" + frames[0]
        self.pub.send_multipart(frames)

    def check(self, k: int) -> bool:
        self.now = now_ms()
        client = b"valid-%d" % k
        if self._status(client) != 200:
            return False
        # a full queue behind the fuzz may drop a DELAY_UNTIL (ZeroMQ's HWM): resend
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._blocked(client, publish=True):
                return True
            self.resent += 1
        return False

    def counters(self) -> dict[str, float]:
        return {"control_malformed": last_count(self.proc, r"control_malformed=(\d+)")}

    def close(self) -> None:
        self.http.close()
        self.pub.close()
        self.ctx.term()
        self.upstream.shutdown()
        self.upstream.server_close()


# --- DThrottle ------------------------------------------------------------------------


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


class DThrottleTarget:
    """``smockron dthrottle`` on TCP; fuzz: hostile tag lines on one connection
    (reopened when an overlong line closes it). Checks: a fresh tag, burst 3, gets
    OK OK OK NO on a clean connection."""

    MAX_TAG = 512

    def __init__(self, workdir: Path) -> None:
        (self.port,) = free_ports(1)
        self.proc = run_smockron(
            [
                "dthrottle",
                "--listen",
                f"tcp:127.0.0.1:{self.port}",
                "--burst",
                "3",
                "--rate",
                "0.001",
                "--stats-interval",
                "0.5",
                "--max-tag-length",
                str(self.MAX_TAG),
            ],
            workdir / "dthrottle.log",
        )
        wait_port(self.port)
        self.sock: socket.socket | None = None
        self.clean = socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def fuzz(self, rng: random.Random) -> None:
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            self.sock.setblocking(False)
        try:
            self.sock.sendall(fuzz.tag_lines(rng, self.MAX_TAG))
            with contextlib.suppress(BlockingIOError):
                while self.sock.recv(65536):
                    pass
                self._reopen()  # recv returned b"": closed by the daemon
        except (BlockingIOError, ConnectionError):
            self._reopen()

    def _reopen(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = None

    def check(self, k: int) -> bool:
        self.clean.sendall(b"valid-%d\n" % k * 4)
        return _read_exact(self.clean, 12) == b"OK\nOK\nOK\nNO\n"

    def counters(self) -> dict[str, float]:
        return {"overlong": last_count(self.proc, r"overlong=(\d+)")}

    def close(self) -> None:
        self._reopen()
        self.clean.close()


# --- JARL -----------------------------------------------------------------------------


class JarlTarget:
    """``smockron jarl``; each fuzz message is a connection from one of 65,536 loopback
    source addresses that sends garbage, or resets at once, or reads its answer. With
    100,000 requests a second allowed (far above this load) every answer is ``0.000``:
    the checks and every answer read verify that."""

    def __init__(self, workdir: Path) -> None:
        (self.port,) = free_ports(1)
        self.proc = run_smockron(
            [
                "jarl",
                "--service",
                "soak",
                "--requests",
                "100000",
                "--period",
                "1",
                "--ip",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            workdir / "jarl.log",
        )
        wait_port(self.port)
        self.wrong = 0

    def _connect(self, source: str) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.settimeout(10)
        s.bind((source, 0))
        s.connect(("127.0.0.1", self.port))
        return s

    def fuzz(self, rng: random.Random) -> None:
        source = f"127.{rng.randrange(1, 255)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
        with contextlib.suppress(OSError), self._connect(source) as s:
            roll = rng.random()
            if roll < 0.4:
                s.sendall(fuzz.nasty(rng, 200))
            if roll > 0.2:  # else: reset at once (linger 0), unread
                answer = s.recv(16)
                self.wrong += answer not in (b"0.000", b"")

    def check(self, k: int) -> bool:
        with self._connect("127.0.0.1") as s:
            return s.recv(16) == b"0.000" and self.wrong == 0

    def counters(self) -> dict[str, float]:
        return {"wrong_answers": self.wrong}

    def close(self) -> None:
        pass


# --- cluster: HTTP gateway and gRPC ---------------------------------------------------


def _cluster(workdir: Path, name: str, server: str) -> tuple[Proc, int, int]:
    grpc_port, http_port, peer_port = free_ports(3)  # the peer port chosen, not gRPC + 1
    proc = run_smockron(
        [
            "cluster",
            "--grpc-address",
            f"127.0.0.1:{grpc_port}",
            "--http-address",
            f"127.0.0.1:{http_port}",
            "--grpc-server",
            server,
            "--peer-address",
            f"127.0.0.1:{peer_port}",
        ],
        workdir / f"{name}.log",
    )
    wait_port(grpc_port)
    wait_port(http_port)
    return proc, grpc_port, http_port


class ClusterHttpTarget:
    """``smockron cluster``'s HTTP gateway; fuzz: hostile JSON bodies on a keep-alive
    connection, and raw not-quite-HTTP on fresh ones. Checks: a fresh key with limit 2
    answers remaining 1, then 0, then OVER_LIMIT."""

    def __init__(self, workdir: Path) -> None:
        self.proc, _, self.port = _cluster(workdir, "cluster-http", "native")
        self.http = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)

    def _post(self, body: bytes) -> tuple[int, bytes]:
        try:
            self.http.request("POST", "/v1/GetRateLimits", body=body)
            resp = self.http.getresponse()
            return resp.status, resp.read()
        except (http.client.HTTPException, OSError):
            self.http.close()  # reopened by the next request
            return 0, b""

    def fuzz(self, rng: random.Random) -> None:
        if rng.random() < 0.2:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=2) as s,
            ):
                s.sendall(fuzz.raw_http(rng, f"127.0.0.1:{self.port}"))
                s.shutdown(socket.SHUT_WR)
                s.recv(4096)
            return
        self._post(fuzz.rate_limit_json(rng))

    def check(self, k: int) -> bool:
        body = json.dumps(
            {
                "requests": [
                    {
                        "name": "soak",
                        "uniqueKey": f"valid-{k}",
                        "hits": "1",
                        "limit": "2",
                        "duration": "60000",
                    }
                ]
            }
        )
        got = []
        for _ in range(3):
            status, data = self._post(body.encode())
            if status != 200:
                return False
            item = json.loads(data)["responses"][0]
            got.append((item.get("status", "UNDER_LIMIT"), item.get("remaining", "0")))
        return got == [("UNDER_LIMIT", "1"), ("UNDER_LIMIT", "0"), ("OVER_LIMIT", "0")]

    def counters(self) -> dict[str, float]:
        return {"malformed": scrape(self.port, "smockron_cluster_http_malformed_total")}

    def close(self) -> None:
        self.http.close()


class ClusterGrpcTarget:
    """``smockron cluster``'s gRPC port; fuzz: raw bytes as requests to known, unknown
    and peer methods. Checks: GetRateLimits for a fresh key with limit 2 answers
    remaining 1, then 0, then OVER_LIMIT."""

    def __init__(self, workdir: Path, server: str = "native") -> None:
        import grpc

        from smockron.cluster.pb import gubernator_pb2 as pb
        from smockron.cluster.pb import gubernator_pb2_grpc

        self.pb, self.grpc = pb, grpc
        self.proc, port, self.http_port = _cluster(workdir, f"cluster-grpc-{server}", server)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = gubernator_pb2_grpc.V1Stub(self.channel)  # type: ignore[no-untyped-call]
        self.calls: dict[str, Callable[..., Any]] = {}

    def fuzz(self, rng: random.Random) -> None:
        method, body = fuzz.grpc_call(rng)
        call = self.calls.get(method)
        if call is None:
            call = self.calls[method] = self.channel.unary_unary(method, None, None)
        with contextlib.suppress(self.grpc.RpcError):
            call(body, timeout=5)

    def check(self, k: int) -> bool:
        pb = self.pb
        req = pb.RateLimitReq(
            name="soak", unique_key=f"valid-{k}", hits=1, limit=2, duration=60_000
        )
        got = []
        for _ in range(3):
            resp = self.stub.GetRateLimits(pb.GetRateLimitsReq(requests=[req]), timeout=10)
            item = resp.responses[0]
            got.append((item.status, item.remaining))
        return got == [(pb.UNDER_LIMIT, 1), (pb.UNDER_LIMIT, 0), (pb.OVER_LIMIT, 0)]

    def counters(self) -> dict[str, float]:
        return {
            name: scrape(self.http_port, f"smockron_cluster_grpc_{name}_total")
            for name in ("malformed", "unknown_method")
        }

    def close(self) -> None:
        self.channel.close()


TARGETS: dict[str, Callable[[Path], Target]] = {
    "master": MasterTarget,
    "proxy": ProxyTarget,
    "dthrottle": DThrottleTarget,
    "jarl": JarlTarget,
    "cluster-http": ClusterHttpTarget,
    "cluster-grpc": ClusterGrpcTarget,
    "cluster-grpc-threads": lambda workdir: ClusterGrpcTarget(workdir, "threads"),
}


@contextlib.contextmanager
def started(name: str, workdir: Path) -> Iterator[Target]:
    target = TARGETS[name](workdir)
    try:
        yield target
    finally:
        with contextlib.suppress(Exception):
            target.close()
        target.proc.stop()


def run(
    name: str, workdir: Path, messages: int, seconds: float, check_every: int = 1000, seed: int = 1
) -> Result:
    """Start listener ``name``, soak it, stop it; the daemon's log is in the result."""
    with started(name, workdir) as target:
        return soak(target, messages, seconds, check_every, seed, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=120.0, help="per listener")
    parser.add_argument("--check-every", type=int, default=1000)
    parser.add_argument("--only", default=",".join(TARGETS))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/smockron-soak"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    for old_log in args.workdir.glob("*.log"):  # the daemons append: start each run afresh
        old_log.unlink()
    print(HEADER, flush=True)
    for name in args.only.split(","):
        result = run(name, args.workdir, args.messages, args.seconds, args.check_every)
        print(result.row(), result.counters, flush=True)
        forged = forged_lines(result.log)
        if forged:
            print(
                f"  {name}: {len(forged)} log lines not written by the logger, e.g. "
                f"{forged[0][:120]!r}",
                flush=True,
            )


if __name__ == "__main__":
    main()
