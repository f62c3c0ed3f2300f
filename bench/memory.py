"""Memory returned: RSS of a master, a proxy and a DThrottle before, during and after a
wave of distinct identifiers that all expire.

For each daemon (real processes on 127.0.0.1): RSS at baseline (started, a little
traffic), right after a wave of ``--identifiers`` distinct identifiers, then every second
for ``--settle`` seconds while their states expire and are swept; the final RSS is
compared with the baseline (goal: within 20%).

Each state is made to last ``--hold`` seconds (default 30), so the whole wave is held
at once:

- master (memory store, ``api:1/HOLDs:1``: one request per window): one ACCEPTED per
  identifier; a state expires two to three windows after its last message;
- proxy (a first line ``api:1/s:1``): one DELAY_UNTIL ``HOLD`` seconds ahead per
  identifier, published by this bench as the master (the delay table and the first
  line fill);
- dthrottle (burst 1, refilled in ``HOLD`` seconds, reports every second): one query per
  tag; a bucket is forgotten once full again.

Run: python bench/memory.py [--identifiers 1000000] [--hold 30] [--settle 120] [--only master]
"""

from __future__ import annotations

import argparse
import re
import socket
import sys
import time
from collections.abc import Callable
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
    proc = run_smockron(["master", "--accounting", f"tcp://127.0.0.1:{acc}",
                         "--control", f"tcp://127.0.0.1:{ctl}", "--rule", f"api:1/{hold}s:1",
                         "--rule", "probe:1/s:1", "--stats-interval", "0",
                         "--queue", "2000000"], workdir / "memory-master.log")  # fmt: skip
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


def proxy_wave(workdir: Path, n: int, hold: int) -> tuple[Proc, Callable[[], None]]:
    listen, ctl, acc, up = free_ports(4)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.bind(f"tcp://127.0.0.1:{ctl}")
    proc = run_smockron(["proxy", "--listen", f"127.0.0.1:{listen}",
                         "--upstream", f"http://127.0.0.1:{up}", "--domain", "api",
                         "--accounting", f"tcp://127.0.0.1:{acc}", "--control",
                         f"tcp://127.0.0.1:{ctl}", "--rule", "api:1/s:1",
                         "--no-master-rules", "--stats-interval", "1"],
                        workdir / "memory-proxy.log")  # fmt: skip
    wait_port(listen)
    time.sleep(1.0)  # the SUB joins

    def received() -> int:
        found = re.findall(r"'control_received': (\d+)", proc.log())
        return int(found[-1]) if found else 0

    def wave() -> None:
        start = received()
        for i in range(n):
            if i % 5_000 == 0:
                until = b"%d" % (int(time.time() * 1000) + hold * 1000)
                time.sleep(0.25)  # paced: a gatekeeper reads its control socket at its pace
            pub.send_multipart([b"api\0", b"DELAY_UNTIL", b"wave-%d" % i, until])
        time.sleep(2.5)
        print(f"  proxy received {received() - start:,} of {n:,} DELAY_UNTILs", flush=True)

    return proc, wave


def dthrottle_wave(workdir: Path, n: int, hold: int) -> tuple[Proc, Callable[[], None]]:
    (port,) = free_ports(1)
    proc = run_smockron(["dthrottle", "--listen", f"tcp:127.0.0.1:{port}", "--burst", "1",
                         "--rate", f"1/{hold}s", "--report-interval", "1"],
                        workdir / "memory-dthrottle.log")  # fmt: skip
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


def measure(name: str, workdir: Path, n: int, hold: int, settle: float) -> tuple[int, int, int]:
    proc, wave = WAVES[name](workdir, n, hold)
    try:
        pid = proc.popen.pid
        time.sleep(1.0)
        baseline = rss_bytes(pid)
        start = time.monotonic()
        wave()
        peak = rss_bytes(pid)
        print(f"  {name}: wave of {n:,} in {time.monotonic() - start:.1f} s", flush=True)
        samples = []
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline:
            time.sleep(1.0)
            samples.append(rss_bytes(pid))
        trace = " ".join(f"{s / MB:.0f}" for s in samples[::10])
        print(f"  {name}: RSS every 10 s after the wave (MB): {trace}", flush=True)
        wait_for(proc.alive, 1)
        return baseline, peak, samples[-1]
    finally:
        proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--identifiers", type=int, default=1_000_000)
    parser.add_argument("--hold", type=int, default=30, help="seconds a state lasts")
    parser.add_argument("--settle", type=float, default=120.0)
    parser.add_argument("--only", default=",".join(WAVES))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/smockron-memory"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    print("| daemon | identifiers | baseline MB | after the wave MB | after expiry MB "
          "| after / baseline |\n|---|---|---|---|---|---|", flush=True)  # fmt: skip
    for name in args.only.split(","):
        base, peak, end = measure(name, args.workdir, args.identifiers, args.hold, args.settle)
        print(f"| {name} | {args.identifiers:,} | {base / MB:.1f} | {peak / MB:.1f} | "
              f"{end / MB:.1f} | {end / base:.2f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
