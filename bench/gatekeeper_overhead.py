"""Gatekeeper overhead: CPU per decision + accounting message, and ASGI throughput cost.

1. Core: a Gatekeeper connected to real ZeroMQ sockets playing the master (so every
   accounting message is really sent); CPU time per ``decide`` (decision + six-frame
   send), goal <= 5 us. Also the bare decision and the two pyzmq send styles.
2. HTTP: a hello-world ASGI app under uvicorn, with and without SmockronMiddleware
   (connected to a live master's sockets), loaded by a separate process with raw
   keep-alive HTTP/1.1 connections; goal >= 90% of the throughput without it.

Run: python bench/gatekeeper_overhead.py [--rounds 5] [--seconds 3] [--skip-http]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zmq
from _common import cpu_seconds

from smockron.gatekeeper.core import AsyncGatekeeper, Gatekeeper, now_ms
from smockron.gatekeeper.state import Decider
from smockron.protocol import encode_accounting
from tests.support import free_port, free_ports, wait_port

N = 200_000


def _sink_main(accounting: str, control: str, counter: Any, stop: Any) -> None:
    """Child process: the master's two sockets; drains accounting and counts it."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.bind(accounting)
    pub = ctx.socket(zmq.PUB)
    pub.bind(control)
    received = 0
    while not stop.is_set():
        if sub.poll(100):
            while True:
                try:
                    sub.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                received += 1
                if not received & 1023:
                    counter.value = received
        counter.value = received
    sub.close(0)
    pub.close(0)
    ctx.term()


class MasterSink:
    """A separate process playing the master's sockets, so its CPU is not ours."""

    def __init__(self) -> None:
        a, c = free_ports(2)
        self.accounting = f"tcp://127.0.0.1:{a}"
        self.control = f"tcp://127.0.0.1:{c}"
        self._count = multiprocessing.Value("q", 0)
        self._stop = multiprocessing.Event()
        self._proc = multiprocessing.Process(
            target=_sink_main, args=(self.accounting, self.control, self._count, self._stop)
        )
        self._proc.start()

    @property
    def received(self) -> int:
        return int(self._count.value)

    def close(self) -> None:
        """Stop once the sink has caught up (its count is still for half a second)."""
        deadline = time.monotonic() + 60
        last = -1
        while self.received != last and time.monotonic() < deadline:
            last = self.received
            time.sleep(0.5)
        self._stop.set()
        self._proc.join(10)


def per_op_us(fn: object, n: int = N) -> tuple[float, float]:
    """CPU microseconds per op: the calling thread's, and the whole process's (zmq I/O too)."""
    t0, p0 = time.thread_time(), time.process_time()
    fn(n)  # type: ignore[operator]
    return (time.thread_time() - t0) / n * 1e6, (time.process_time() - p0) / n * 1e6


def bench_core(rounds: int) -> dict[str, float]:
    sink = MasterSink()
    gk = Gatekeeper(sink.accounting, sink.control, ["api"])
    deadline = time.monotonic() + 5
    while not gk.master_connected and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gk.master_connected, "bench master sockets never connected"
    ids = [b"client-%d" % i for i in range(1000)]
    now = now_ms()
    for i in range(0, 1000, 10):  # 10% of identifiers are under a delay
        gk.decider.table.update(b"api", ids[i], now + 3_600_000, now)

    def decide_sync(n: int) -> None:
        decide = gk.decide
        for i in range(n):
            d = decide(b"api", ids[i % 1000])
            if d.until_ms:
                gk.release()

    agk = AsyncGatekeeper(sink.accounting, sink.control, ["api"])

    async def connect_async() -> None:
        agk.start()
        while not agk.master_connected:
            await asyncio.sleep(0.01)

    loop = asyncio.new_event_loop()
    loop.run_until_complete(connect_async())
    for i in range(0, 1000, 10):
        agk.decider.table.update(b"api", ids[i], now + 3_600_000, now)

    def decide_async_twin(n: int) -> None:
        """Flushed after every decision: the unbatched worst case (call_soon + flush each)."""
        decide = agk.decide
        release = agk.release
        flush = agk.flush
        for i in range(n):
            if decide(b"api", ids[i % 1000]).until_ms:
                release()
            flush()

    def decide_async_batched(n: int) -> None:
        """Flushed every 16 decisions, as when 16 requests are decided in one loop turn."""
        decide = agk.decide
        release = agk.release
        flush = agk.flush
        for i in range(n):
            if decide(b"api", ids[i % 1000]).until_ms:
                release()
            if not i & 15:
                flush()
        flush()

    pure = Decider()

    def decide_pure(n: int) -> None:
        for i in range(n):
            if pure.decide(b"api", ids[i % 1000], now).until_ms:
                pure.release()

    pub = gk._pub
    assert pub is not None
    frames = encode_accounting(b"api", b"ACCEPTED", b"client-1", now)

    def send_multipart(n: int) -> None:
        for _ in range(n):
            pub.send_multipart(frames, zmq.NOBLOCK)

    def send_sndmore(n: int) -> None:
        more = zmq.SNDMORE | zmq.NOBLOCK
        for _ in range(n):
            for f in frames[:-1]:
                pub.send(f, more)
            pub.send(frames[-1], zmq.NOBLOCK)

    raw_send = zmq.backend.Socket.send

    def send_compiled(n: int) -> None:
        more = zmq.SNDMORE | zmq.NOBLOCK
        for _ in range(n):
            for f in frames[:-1]:
                raw_send(pub, f, more)
            raw_send(pub, frames[-1], zmq.NOBLOCK)

    cases = {
        "decide+account, threaded Gatekeeper (lock)": decide_sync,
        "decide+account, AsyncGatekeeper": decide_async_twin,
        "decide+account, AsyncGatekeeper, batches of 16": decide_async_batched,
        "decision only (pure Decider)": decide_pure,
        "5-frame send_multipart": send_multipart,
        "5 x send(SNDMORE)": send_sndmore,
        "5 x compiled send(SNDMORE) (what core.py does)": send_compiled,
    }
    results: dict[str, list[float]] = {k: [] for k in cases}
    process: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            thread_us, process_us = per_op_us(fn)
            results[name].append(thread_us)
            process[name].append(process_us)
            time.sleep(0.05)
    loop.run_until_complete(agk.aclose())
    loop.close()
    gk.close()
    time.sleep(0.2)
    sink.close()
    print(
        f"\n== core: CPU per operation, median of {rounds} x {N} (calling thread | whole process)"
    )
    medians = {}
    for name, values in results.items():
        medians[name] = statistics.median(values)
        runs = ", ".join(f"{v:.2f}" for v in values)
        whole = statistics.median(process[name])
        print(f"  {name:45s} {medians[name]:6.2f} us | {whole:6.2f} us   (thread runs: {runs})")
    sent = gk.counters.accounting_sent + agk.counters.accounting_sent
    print(f"  accounting messages: {sent} sent by the gatekeepers (plus the raw send cases),")
    print(f"  {sink.received} received by the sink (PUB drops beyond SNDHWM when it lags)")
    for name in (
        "decide+account, threaded Gatekeeper (lock)",
        "decide+account, AsyncGatekeeper, batches of 16",
        "decide+account, AsyncGatekeeper",
    ):
        goal = medians[name]
        verdict = "MET" if goal <= 5 else "NOT MET"
        print(f"  goal <= 5 us per decision+accounting, {name}: {verdict} ({goal:.2f} us)")
    return medians


# ---- HTTP part -------------------------------------------------------------------------


async def hello(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
    if scope["type"] != "http":
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/plain"), (b"content-length", b"12")],
        }
    )  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b"hello world\n"})  # type: ignore[operator]


def serve(port: int, accounting: str | None, control: str | None) -> None:
    """Child process: uvicorn serving the hello app, optionally wrapped."""
    import uvicorn

    from smockron.gatekeeper.asgi import SmockronMiddleware

    app: object = hello
    if accounting == "none":  # the middleware with no master configured: Python cost only
        app = SmockronMiddleware(hello, domain="api")
    elif accounting:
        app = SmockronMiddleware(hello, domain="api", accounting=accounting, control=control)
    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="error", access_log=False, lifespan="on"
    )  # type: ignore[arg-type]


async def _load(port: int, seconds: float, conns: int) -> int:
    request = b"GET / HTTP/1.1\r\nHost: bench\r\nUser-Agent: bench\r\n\r\n"
    done = 0
    deadline = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.monotonic() < deadline:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            done += 1
        writer.close()

    await asyncio.gather(*(worker() for _ in range(conns)))
    return done


def load(port: int, seconds: float, conns: int) -> None:
    """Child process: keep-alive load; prints requests per second."""
    print(asyncio.run(_load(port, seconds, conns)) / seconds)


def measure(with_mw: bool, sink: MasterSink, seconds: float) -> tuple[float, float]:
    """(requests per second, server CPU microseconds per request) for one run."""
    port = free_port()
    args = [sys.executable, __file__, "--serve", str(port)]
    if with_mw:
        args += ["--accounting", sink.accounting, "--control", sink.control]
    server = subprocess.Popen(args)
    try:
        wait_port(port)
        cpu0 = cpu_seconds(server.pid)
        out = subprocess.run(
            [sys.executable, __file__, "--load", str(port), "--seconds", str(seconds)],
            capture_output=True,
            text=True,
            check=True,
        )
        rps = float(out.stdout.strip())
        cpu = cpu_seconds(server.pid) - cpu0
        return rps, cpu / (rps * seconds) * 1e6
    finally:
        server.terminate()
        server.wait(10)


def bench_http(rounds: int, seconds: float) -> float:
    sink = MasterSink()
    runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    try:
        for _ in range(rounds):  # interleaved so machine noise hits both alike
            runs[False].append(measure(False, sink, seconds))
            runs[True].append(measure(True, sink, seconds))
    finally:
        sink.close()
    plain = [r for r, _ in runs[False]]
    wrapped = [r for r, _ in runs[True]]
    p, w = statistics.median(plain), statistics.median(wrapped)
    cpu_p = statistics.median(c for _, c in runs[False])
    cpu_w = statistics.median(c for _, c in runs[True])
    print(
        "\n== HTTP: hello-world ASGI under uvicorn, separate load process (16 keep-alive"
        f" connections), median of {rounds} x {seconds}s"
    )
    for name, rps, cpu, values in (
        ("without middleware", p, cpu_p, runs[False]),
        ("with middleware", w, cpu_w, runs[True]),
    ):
        detail = ", ".join(f"{r:.0f}" for r, _ in values)
        print(f"  {name:19s} {rps:7.0f} req/s, server CPU {cpu:6.1f} us/request   (runs: {detail})")
    print(f"  accounting messages received by the master sink: {sink.received}")
    pairs = statistics.median(x / y for x, y in zip(wrapped, plain, strict=True))
    print(f"  median of the per-round throughput ratios (pairs run back to back): {pairs:.3f}")
    print(f"  server CPU ratio without/with (throughput ratio if CPU-bound): {cpu_p / cpu_w:.3f}")
    print(f"  throughput ratio of medians with/without: {w / p:.3f}  goal >= 0.90: "
          f"{'MET' if w / p >= 0.9 else 'NOT MET'}")  # fmt: skip
    return w / p


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--skip-http", action="store_true")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--load", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--accounting", help=argparse.SUPPRESS)
    parser.add_argument("--control", help=argparse.SUPPRESS)
    parser.add_argument("--conns", type=int, default=16)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.accounting, args.control)
        return
    if args.load:
        load(args.load, args.seconds, args.conns)
        return
    print(
        f"gatekeeper overhead, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"python {sys.version.split()[0]}, pyzmq {zmq.__version__}, {os.cpu_count()} CPUs (shared)"
    )
    bench_core(args.rounds)
    if not args.skip_http:
        bench_http(args.rounds, args.seconds)


if __name__ == "__main__":
    main()
