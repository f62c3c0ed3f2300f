"""What CURVE costs the master: accounting messages per second with and without keys.

    python bench/curve_overhead.py [--messages 200000] [--runs 3]

Method (bench/master_throughput.py's): start a `smockron master` process, and a sender
process that connects (with CURVE keys from `smockron.curve.keygen`, or without) and
handshakes (probe messages until the master answers one); SIGSTOP the master, let the
sender send everything (it waits in the sender's queue and the kernel's buffers), then
SIGCONT the master and time until its metrics count every message. The CURVE runs pay
for decryption in the master's ZeroMQ I/O thread on top of the same work. Workload:
6-frame ACCEPTED messages over 10,000 identifiers, one domain ruled ``1/m:30``.

On a shared two-core machine the rate also counts the sender's encryption (its I/O
thread encrypts what was queued while the master was stopped, beside the master), so
the master's own CPU time per message (user + system, all its threads, from /proc) is
printed too: that is the cost a master pays with gatekeepers on other machines.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import zmq
from _common import ROOT, cpu_seconds, free_ports, median, smockron_env

from smockron.curve import curve_client, keygen

IDENTIFIERS = 10_000


def run_sender(acc: int, ctl: int, messages: int, keys: str | None) -> None:
    """Role: connect, handshake, wait for "go" on stdin, send ``messages``."""
    ctx = zmq.Context()
    pub, sub = ctx.socket(zmq.PUB), ctx.socket(zmq.SUB)
    if keys is not None:
        curve = curve_client(Path(keys) / "gk.key_secret", Path(keys) / "master.key")
        assert curve is not None
        curve.secure(pub)
        curve.secure(sub)
    pub.setsockopt(zmq.SNDHWM, 0)
    sub.subscribe(b"")
    pub.connect(f"tcp://127.0.0.1:{acc}")
    sub.connect(f"tcp://127.0.0.1:{ctl}")
    probe = 0
    while not sub.poll(100):
        probe += 1
        pub.send_multipart(
            [b"probe\0", b"ACCEPTED", b"p%d" % probe, b"%d" % int(time.time() * 1000), b""]
        )
    print("ready", flush=True)
    sys.stdin.readline()
    idents = [b"user-%05d" % i for i in range(IDENTIFIERS)]
    ts = b"%d" % int(time.time() * 1000)
    send = pub.send_multipart
    for i in range(messages):
        send([b"bench\0", b"ACCEPTED", idents[i % IDENTIFIERS], ts, b"", b"ua=bench/1.0"])
    print("sent", flush=True)
    sys.stdin.readline()
    pub.close(linger=0)
    sub.close()
    ctx.term()


def counted(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    prefix = 'smockron_master_messages_total{domain="bench"'
    return int(sum(float(ln.rpartition(" ")[2]) for ln in lines if ln.startswith(prefix)))


def measure(messages: int, keys: Path | None) -> tuple[float, float]:
    """(messages per second, the master's CPU microseconds per message)."""
    acc, ctl, met = free_ports(3)
    curve = []
    if keys is not None:
        curve = [
            "--curve-secret",
            str(keys / "master.key_secret"),
            "--curve-clients",
            str(keys / "ok"),
        ]
    master = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "smockron",
            "master",
            "--accounting",
            f"tcp://127.0.0.1:{acc}",
            "--control",
            f"tcp://127.0.0.1:{ctl}",
            "--rule",
            "bench:1/m:30",
            "--rule",
            "probe:1/s:1",
            "--metrics",
            f"127.0.0.1:{met}",
            "--skew-tolerance",
            "3600",
            "--stats-interval",
            "0",
            "--queue",
            str(messages + 100_000),
            "--hwm",
            "10000000",
            *curve,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=smockron_env(),
        cwd=ROOT,
    )
    role = [] if keys is None else ["--keys", str(keys)]
    sender = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--role",
            "sender",
            "--acc",
            str(acc),
            "--ctl",
            str(ctl),
            "--messages",
            str(messages),
            *role,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=smockron_env(),
    )
    try:
        assert sender.stdin is not None and sender.stdout is not None
        assert sender.stdout.readline().strip() == "ready"
        time.sleep(2.2)  # past the master's backlog window after a connection
        master.send_signal(signal.SIGSTOP)
        sender.stdin.write("go\n")
        sender.stdin.flush()
        assert sender.stdout.readline().strip() == "sent"
        time.sleep(0.3)
        t0, cpu0 = time.time(), cpu_seconds(master.pid)
        master.send_signal(signal.SIGCONT)
        while counted(met) < messages and time.time() < t0 + 300:
            time.sleep(0.01)
        elapsed, cpu = time.time() - t0, cpu_seconds(master.pid) - cpu0
        assert counted(met) >= messages
        sender.stdin.write("quit\n")
        sender.stdin.flush()
        return messages / elapsed, cpu / messages * 1e6
    finally:
        for proc in (sender, master):
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
            proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role")
    parser.add_argument("--acc", type=int)
    parser.add_argument("--ctl", type=int)
    parser.add_argument("--keys")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.role == "sender":
        run_sender(args.acc, args.ctl, args.messages, args.keys)
        return
    folder = Path(tempfile.mkdtemp(prefix="smockron-curve-bench-"))
    try:
        keygen(folder, "master")
        keygen(folder, "gk")
        (folder / "ok").mkdir()
        shutil.copy(folder / "gk.key", folder / "ok")
        runs: dict[str, list[tuple[float, float]]] = {"no keys": [], "CURVE": []}
        for _ in range(args.runs):  # interleaved, so machine noise hits both alike
            runs["no keys"].append(measure(args.messages, None))
            runs["CURVE"].append(measure(args.messages, folder))
        for name, values in runs.items():
            rates, cpus = [r for r, _ in values], [c for _, c in values]
            print(
                f"{name:8}: median {median(rates):,.0f} msg/s "
                f"({', '.join(f'{v:,.0f}' for v in rates)}); master CPU median "
                f"{median(cpus):.2f} us/msg ({', '.join(f'{c:.2f}' for c in cpus)})"
            )
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
