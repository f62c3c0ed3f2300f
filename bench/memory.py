"""Memory returned: RSS of a master, a proxy and a DThrottle before, during and after a
wave of distinct identifiers that all expire.

For each daemon (real processes on 127.0.0.1): RSS at baseline (started, a little
traffic), right after a wave of ``--identifiers`` distinct identifiers, then every second
for ``--settle`` seconds while their states expire and are swept; the final RSS is
compared with the baseline (goal: within 20%). Each daemon runs on each of
``--allocators``: ``default`` (CPython's pymalloc, what a daemon runs on unless told
otherwise) and ``malloc`` (``PYTHONMALLOC=malloc``: glibc's, which ``malloc_trim`` can
empty anywhere in the heap); ``--runs`` rounds of all, then the medians.

Each state is made to last ``--hold`` seconds (default 30), so the whole wave is held
at once:

- master (memory store, ``api:1/HOLDs:1``: one request per window): one ACCEPTED per
  identifier; a state expires two to three windows after its last message;
- proxy (a first line ``api:1/s:1``): one DELAY_UNTIL per identifier, all until
  ``HOLD`` seconds after the wave (paced at 20,000 a second, what a gatekeeper's control
  thread keeps up with here), published by this bench as the master (the delay table and
  the first line fill);
- dthrottle (burst 1, refilled in ``HOLD`` seconds, reports every second): one query per
  tag; a bucket is forgotten once full again.

tests/test_memory.py runs :func:`measure` at a smaller scale.

Run: python bench/memory.py [--identifiers 1000000] [--hold 30] [--settle 120] [--runs 3]
    [--allocators default,malloc] [--only master,proxy,dthrottle]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "bench"):  # the repository (tests.support), this folder (soak)
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import zmq  # noqa: E402
from soak import rss_bytes  # noqa: E402

from tests.support import Proc, free_ports, run_smockron, wait_for, wait_port  # noqa: E402

MB = 1 << 20


def master_wave(workdir: Path, n: int, hold: int) -> tuple[Proc, Callable[[], None]]:
    from tests.master.client import FakeGatekeeper, now_ms

    acc, ctl = free_ports(2)
    proc = run_smockron(
        [
            "master",
            "--accounting",
            f"tcp://127.0.0.1:{acc}",
            "--control",
            f"tcp://127.0.0.1:{ctl}",
            "--rule",
            f"api:1/{hold}s:1",
            "--rule",
            "probe:1/s:1",
            "--stats-interval",
            "0",
            "--queue",
            "2000000",
        ],
        workdir / "memory-master.log",
    )
    gk = FakeGatekeeper(acc, ctl)
    gk.handshake()

    def wave() -> None:
        send = gk.pub.send_multipart
        for i in range(n):
            if i % 10_000 == 0:
                t = b"%d" % now_ms()
                time.sleep(0.02)  # stay under the master's queue bound
            send([b"api\0", b"ACCEPTED", b"wave-%d" % i, t, b""])
        gk.handshake()  # everything before it has been processed

    return proc, wave


PACE = 0.25
"""Seconds between two bursts of 5,000 DELAY_UNTILs to the proxy."""


def proxy_wave(workdir: Path, n: int, hold: int) -> tuple[Proc, Callable[[], None]]:
    listen, ctl, acc, up = free_ports(4)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.bind(f"tcp://127.0.0.1:{ctl}")
    proc = run_smockron(
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
            "--rule",
            "api:1/s:1",
            "--no-master-rules",
            "--stats-interval",
            "1",
        ],
        workdir / "memory-proxy.log",
    )
    wait_port(listen)
    time.sleep(1.0)  # the SUB joins

    def received() -> int:
        found = re.findall(r"control_received=(\d+)", proc.log())
        return int(found[-1]) if found else 0

    def wave() -> None:
        start = received()
        # every state expires ``hold`` seconds after the (paced) wave has been sent
        until = b"%d" % (int(time.time() * 1000) + int(1000 * (hold + PACE * n / 5_000)))
        for i in range(n):
            if i % 5_000 == 0:
                time.sleep(PACE)  # paced: a gatekeeper reads its control socket at its pace
            pub.send_multipart([b"api\0", b"DELAY_UNTIL", b"wave-%d" % i, until])
        time.sleep(2.5)
        print(f"  proxy received {received() - start:,} of {n:,} DELAY_UNTILs", flush=True)

    return proc, wave


def dthrottle_wave(workdir: Path, n: int, hold: int) -> tuple[Proc, Callable[[], None]]:
    (port,) = free_ports(1)
    proc = run_smockron(
        [
            "dthrottle",
            "--listen",
            f"tcp:127.0.0.1:{port}",
            "--burst",
            "1",
            "--rate",
            f"1/{hold}s",
            "--report-interval",
            "1",
        ],
        workdir / "memory-dthrottle.log",
    )
    wait_port(port)

    def wave() -> None:
        with socket.create_connection(("127.0.0.1", port)) as s:
            for start in range(0, n, 1000):
                s.sendall(b"".join(b"wave-%d\n" % i for i in range(start, min(n, start + 1000))))
                got = 0
                while got < 3 * min(1000, n - start):
                    got += len(s.recv(65536))

    return proc, wave


WAVES = {"master": master_wave, "proxy": proxy_wave, "dthrottle": dthrottle_wave}


@contextlib.contextmanager
def allocator(name: str) -> Iterator[None]:
    """Daemons started in the block run on ``name``: ``default`` (``PYTHONMALLOC`` unset:
    CPython's pymalloc), or a ``PYTHONMALLOC`` value (``malloc``: glibc's)."""
    before = os.environ.pop("PYTHONMALLOC", None)
    if name != "default":
        os.environ["PYTHONMALLOC"] = name
    try:
        yield
    finally:
        os.environ.pop("PYTHONMALLOC", None)
        if before is not None:
            os.environ["PYTHONMALLOC"] = before


@dataclass
class Sample:
    baseline: int
    peak: int
    after: int

    @property
    def ratio(self) -> float:
        return self.after / self.baseline


def measure(
    name: str,
    workdir: Path,
    n: int,
    hold: int,
    settle: float,
    goal: float | None = None,
    quiet: bool = False,
    trace_every: int = 10,
) -> Sample:
    """One daemon's RSS at baseline, right after a wave of ``n`` identifiers, and
    ``settle`` seconds later (sooner once within ``goal`` times the baseline, if given)."""
    proc, wave = WAVES[name](workdir, n, hold)
    try:
        pid = proc.popen.pid
        time.sleep(1.0)
        baseline = rss_bytes(pid)
        start = time.monotonic()
        wave()
        peak, peak_at = rss_bytes(pid), time.monotonic()
        samples = []
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline:
            time.sleep(1.0)
            samples.append(rss_bytes(pid))
            if goal is not None and samples[-1] <= goal * baseline:
                break
        if not quiet:
            trace = " ".join(f"{s / MB:.0f}" for s in samples[::trace_every])
            print(
                f"  {name}: wave of {n:,} in {peak_at - start:.1f} s; RSS every "
                f"{trace_every} s after it (MB): {trace}",
                flush=True,
            )
        wait_for(proc.alive, 1)
        return Sample(baseline, peak, samples[-1])
    finally:
        proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--identifiers", type=int, default=1_000_000)
    parser.add_argument("--hold", type=int, default=30, help="seconds a state lasts")
    parser.add_argument("--settle", type=float, default=120.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--trace-every", type=int, default=10, help="seconds between RSS shown")
    parser.add_argument("--only", default=",".join(WAVES))
    parser.add_argument(
        "--allocators",
        default="default,malloc",
        help="default (PYTHONMALLOC unset), or PYTHONMALLOC values",
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/smockron-memory"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    allocators = args.allocators.split(",")
    results: dict[tuple[str, str], list[Sample]] = {}
    for run in range(args.runs):  # rounds, so a slow spell of the machine hits every case
        for name in args.only.split(","):
            for alloc in allocators:
                with allocator(alloc):
                    sample = measure(
                        name,
                        args.workdir,
                        args.identifiers,
                        args.hold,
                        args.settle,
                        trace_every=args.trace_every,
                    )
                results.setdefault((name, alloc), []).append(sample)
                print(
                    f"run {run + 1} {name} {alloc}: {sample.baseline / MB:.1f} -> "
                    f"{sample.peak / MB:.1f} -> {sample.after / MB:.1f} MB, "
                    f"{sample.ratio:.2f}",
                    flush=True,
                )
    print(
        f"\nmedians of {args.runs} run(s), {args.identifiers:,} identifiers\n"
        "| daemon | allocator | baseline MB | after the wave MB | after expiry MB "
        "| after / baseline |\n|---|---|---|---|---|---|"
    )
    for (name, alloc), samples in results.items():
        base, peak, end = (
            statistics.median(getattr(s, f) for s in samples) for f in ("baseline", "peak", "after")
        )
        ratio = statistics.median(s.ratio for s in samples)
        print(
            f"| {name} | {alloc} | {base / MB:.1f} | {peak / MB:.1f} | {end / MB:.1f} | "
            f"{ratio:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
