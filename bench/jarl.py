"""JARL: connections answered per second and connect-to-answer latency.

Runs a real ``smockron jarl`` (uvloop) and measures, in rounds:
- sequential: one client, connect + recv(7) in a loop (the seed's ~232 us figure);
- concurrent: 2 client processes x C connections in flight each (epoll), counting
  answered connections per second and each one's connect-to-answer time.
Prints medians over the rounds and the ratio to the issue's goals
(p50 <= 150 us, >= 10,000 connections/s). Usage: python bench/jarl.py [--quick]
"""

from __future__ import annotations

import multiprocessing
import select
import socket
import sys
import time

from _common import cpu_seconds, daemon, free_port, median, percentile

GOAL_P50_US = 150.0
GOAL_RATE = 10_000.0


def sequential(port: int, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.connect(("127.0.0.1", port))
            data = s.recv(7)
        samples.append(time.perf_counter() - start)
        float(data)
    return samples


def _client_process(args: tuple[int, int, float]) -> tuple[int, float, list[float]]:
    """Keep ``inflight`` connections open with epoll; a lean client leaves CPU to the server."""
    port, inflight, seconds = args
    address = ("127.0.0.1", port)
    poller = select.epoll()
    waiting: dict[int, tuple[socket.socket, float]] = {}
    samples: list[float] = []

    def launch() -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        start = time.perf_counter()
        s.connect_ex(address)  # EINPROGRESS; the answer makes the socket readable
        poller.register(s.fileno(), select.EPOLLIN)
        waiting[s.fileno()] = (s, start)

    began = time.perf_counter()
    deadline = began + seconds
    for _ in range(inflight):
        launch()
    while waiting:
        for fd, _ in poller.poll(5.0):
            s, start = waiting.pop(fd)
            answer = s.recv(16)
            samples.append(time.perf_counter() - start)
            poller.unregister(fd)
            s.close()
            float(answer)
            if time.perf_counter() < deadline:
                launch()
    poller.close()
    return len(samples), time.perf_counter() - began, samples


def concurrent(port: int, procs: int, inflight: int, seconds: float) -> tuple[float, list[float]]:
    """Connections per second summed over client processes, each timing its own run."""
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(procs) as pool:
        results = pool.map(_client_process, [(port, inflight, seconds)] * procs)
    rate = sum(n / elapsed for n, elapsed, _ in results)
    return rate, [s for _, _, samples in results for s in samples]


INFLIGHT = (1, 4, 32)  # connections in flight per client process (2 processes)


def main() -> None:
    quick = "--quick" in sys.argv
    rounds, seq_n, seconds = (2, 500, 1.0) if quick else (5, 3000, 1.5)
    port = free_port()
    args = [
        "jarl",
        "--service",
        "bench",
        "--period",
        "1",
        "--requests",
        "1000000",
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    seq_p50: list[float] = []
    seq_p99: list[float] = []
    rates: dict[int, list[float]] = {n: [] for n in INFLIGHT}
    p50s: dict[int, list[float]] = {n: [] for n in INFLIGHT}
    p99s: dict[int, list[float]] = {n: [] for n in INFLIGHT}
    cpu_us: list[float] = []
    with daemon(args, port) as proc:
        sequential(port, 200)  # warm up
        for _ in range(rounds):
            s = sequential(port, seq_n)
            seq_p50.append(percentile(s, 0.5) * 1e6)
            seq_p99.append(percentile(s, 0.99) * 1e6)
            for inflight in INFLIGHT:
                cpu_before = cpu_seconds(proc.pid)
                rate, c = concurrent(port, procs=2, inflight=inflight, seconds=seconds)
                cpu_us.append((cpu_seconds(proc.pid) - cpu_before) / len(c) * 1e6)
                rates[inflight].append(rate)
                p50s[inflight].append(percentile(c, 0.5) * 1e6)
                p99s[inflight].append(percentile(c, 0.99) * 1e6)
    best = max(median(r) for r in rates.values())
    print(f"jarl, {rounds} rounds, medians (2-core machine shared with other work)")
    print(
        f"  1 sequential client:      p50 {median(seq_p50):7.1f} us  p99 {median(seq_p99):7.1f} us"
        f"   (goal p50 <= {GOAL_P50_US:.0f} us: ratio {median(seq_p50) / GOAL_P50_US:.2f})"
    )
    for n in INFLIGHT:
        print(
            f"  2 procs x {n:2d} in flight: p50 {median(p50s[n]):7.1f} us  p99 "
            f"{median(p99s[n]):7.1f} us  {median(rates[n]):7.0f} conn/s"
        )
    print(f"  best rate {best:.0f} conn/s (goal >= {GOAL_RATE:.0f}: ratio {best / GOAL_RATE:.2f})")
    print(
        f"  server CPU per connection: {median(cpu_us):.1f} us"
        f" (one core could answer ~{1e6 / median(cpu_us):.0f} conn/s)"
    )


if __name__ == "__main__":
    main()
