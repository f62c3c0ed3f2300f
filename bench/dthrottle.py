"""DThrottle: pipelined queries per second into one daemon, and single-query latency.

Runs a real ``smockron dthrottle`` (uvloop, TCP on loopback) and measures, in rounds:
- pipelined: N client processes, one connection each, keeping two batches of B queries
  in flight (send a batch, read the replies to the previous one); 1,000 distinct tags and
  a burst large enough that every answer is OK (the slower path: it counts hits);
- single: one query at a time on one connection, send ``tag\n`` and read 3 bytes.
Prints medians over the rounds and the ratio to the issue's goals
(>= 300,000 queries/s, p99 of a single query <= 200 us).
Usage: python bench/dthrottle.py [--quick]
"""

from __future__ import annotations

import multiprocessing
import socket
import sys
import time

from _common import cpu_seconds, daemon, free_port, median, percentile

GOAL_RATE = 300_000.0
GOAL_P99_US = 200.0
TAGS = [b"client-%d" % i for i in range(1000)]


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _read(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("daemon closed the connection")
        buf += chunk
    return bytes(buf)


def _pipelined(args: tuple[int, int, float]) -> int:
    port, batch, seconds = args
    payload = b"".join(TAGS[i % len(TAGS)] + b"\n" for i in range(batch))
    answered = 0
    with _connect(port) as s:
        s.sendall(payload)
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            s.sendall(payload)
            replies = _read(s, 3 * batch)
            answered += batch
        replies = _read(s, 3 * batch)
        assert replies == b"OK\n" * batch, replies[:30]
        answered += batch
    return answered


def pipelined(port: int, procs: int, batch: int, seconds: float) -> tuple[float, int]:
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(procs) as pool:
        start = time.perf_counter()
        total = sum(pool.map(_pipelined, [(port, batch, seconds)] * procs))
        elapsed = time.perf_counter() - start
    return total / elapsed, total


def single(port: int, n: int) -> list[float]:
    samples = []
    with _connect(port) as s:
        for i in range(n):
            query = TAGS[i % len(TAGS)] + b"\n"
            start = time.perf_counter()
            s.sendall(query)
            reply = _read(s, 3)
            samples.append(time.perf_counter() - start)
            assert reply == b"OK\n"
    return samples


def main() -> None:
    quick = "--quick" in sys.argv
    rounds, n, seconds = (2, 2000, 1.0) if quick else (5, 10000, 2.0)
    port = free_port()
    args = [
        "dthrottle",
        "--listen",
        f"tcp:127.0.0.1:{port}",
        "--burst",
        "1000000000",
        "--report-interval",
        "3600",
        "--stats-interval",
        "0",
    ]
    with daemon(args, port) as proc:
        single(port, 500)  # warm up
        rates1, rates2, p50, p99, cpu_us = [], [], [], [], []
        for _ in range(rounds):
            cpu_before = cpu_seconds(proc.pid)
            rate, total = pipelined(port, procs=1, batch=4000, seconds=seconds)
            cpu_us.append((cpu_seconds(proc.pid) - cpu_before) / total * 1e6)
            rates1.append(rate)
            rates2.append(pipelined(port, procs=2, batch=4000, seconds=seconds)[0])
            s = single(port, n)
            p50.append(percentile(s, 0.5) * 1e6)
            p99.append(percentile(s, 0.99) * 1e6)
    best = max(median(rates1), median(rates2))
    print(f"dthrottle, {rounds} rounds, medians (2-core machine shared with other work)")
    print(f"  pipelined, 1 connection:  {median(rates1):9.0f} queries/s")
    print(
        f"  pipelined, 2 connections: {median(rates2):9.0f} queries/s"
        f"   (goal >= {GOAL_RATE:.0f}: best ratio {best / GOAL_RATE:.2f})"
    )
    print(
        f"  server CPU per pipelined query: {median(cpu_us):.2f} us"
        f" (one core could answer ~{1e6 / median(cpu_us):.0f} queries/s)"
    )
    print(
        f"  single query: p50 {median(p50):6.1f} us   p99 {median(p99):6.1f} us"
        f"   (goal p99 <= {GOAL_P99_US:.0f} us: ratio {median(p99) / GOAL_P99_US:.2f})"
    )


if __name__ == "__main__":
    main()
