"""DELAY_UNTILs published at a fixed rate vs received by 1 and 4 gatekeepers.

A publisher plays the master (a bound PUB, messages as the master sends them, paced at
``--rate``); each gatekeeper (asyncio twin and threaded, in processes of their own)
counts what it applied. Goal: >= 99.9% received at 200,000/s per gatekeeper. Baseline in
the same run: a bare pyzmq SUB doing only ``recv_multipart``.

With ``--master``: a real ``smockron master`` (memory store, ``api:1/h:1``) fed
accounting for ``--identifiers`` distinct identifiers as fast as one feeder sends, so it
publishes one DELAY_UNTIL each at its full rate to 1 and 4 real gatekeepers
(asyncio twin, each in a process of its own). Printed per gatekeeper count: what the
master published (its heartbeat's count), what the worst gatekeeper received and lost
(``control_lost``), the identifiers it held when the stream ended and after its
RESYNCs, and how long after the end of the stream it held them all.

With ``--resync 100000,1000000``: for each size, a real master holding that many live
delays (fed as above), and a gatekeeper (asyncio twin, threaded twin) started afresh
``--rounds`` times, as after a restart: the time from its start until its RESYNC has
restored the whole table (median). Goal: within 1 s.

Run: python bench/control_plane.py [--messages 1000000] [--rate 200000] [--rounds 3]
     python bench/control_plane.py --master [--identifiers 1000000] [--rounds 3]
     python bench/control_plane.py --resync 100000,1000000 [--rounds 3]
Traffic goes to 127.0.0.1 only; every process stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zmq

from smockron.master.engine import BACKLOG_MS
from smockron.wire.batchio import send_all
from smockron.wire.codec import (
    ACCEPTED,
    PUBLISHED,
    RULES_TOPIC,
    decode_published,
    encode_accounting,
    encode_control,
)
from tests.support import free_port, smockron_env


def receiver(kind: str, control: str, seconds: float) -> None:
    """Role: receive for ``seconds`` after the first message, print the count."""
    if kind == "raw":
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.subscribe(b"api\0")
        sub.connect(control)
        print("ready", flush=True)
        n = 0
        deadline = None
        while deadline is None or time.monotonic() < deadline:
            if sub.poll(100):
                sub.recv_multipart()
                n += 1
                deadline = deadline or time.monotonic() + seconds
        print("got", n, flush=True)
        return
    from smockron.gatekeeper._asyncio import AsyncGatekeeper
    from smockron.gatekeeper._threaded import Gatekeeper

    if kind == "threaded":
        gk = Gatekeeper(None, control, ["api"], max_entries=2_000_000)
        print("ready", flush=True)
        while gk.counters.control_received == 0:
            time.sleep(0.01)
        time.sleep(seconds)
        print("got", gk.counters.control_received, flush=True)
        gk.close()
        return

    async def run() -> None:
        agk = AsyncGatekeeper(None, control, ["api"], max_entries=2_000_000)
        agk.start()
        print("ready", flush=True)
        while agk.counters.control_received == 0:
            await asyncio.sleep(0.01)
        await asyncio.sleep(seconds)
        print("got", agk.counters.control_received, flush=True)
        await agk.aclose()

    asyncio.run(run())


FULL = "full_after_s"
LATE = "late_s"


def master_receiver(accounting: str, control: str, seconds: float) -> None:
    """Role: a gatekeeper of a real master; report what it received, lost and holds."""
    from smockron.gatekeeper._asyncio import AsyncGatekeeper

    async def run() -> None:
        gk = AsyncGatekeeper(accounting, control, ["api"], max_entries=4_000_000)
        gk.start()
        while gk.resyncs_done == 0:  # connected both ways: its first resync answered
            await asyncio.sleep(0.01)
        print("ready", flush=True)
        baseline = gk.resyncs_done
        received = gk._controls[0].received  # DELAY_UNTILs per domain, marks not counted
        while not received.get(b"api"):
            await asyncio.sleep(0.001)
        last_at, last = time.monotonic(), 0
        held_at_end = -1
        stream_end = 0.0
        samples: list[tuple[float, int]] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            if received[b"api"] != last:
                last_at, last = now, received[b"api"]
            held = len(gk.decider.table)
            samples.append((now, held))
            if held_at_end < 0 and now - last_at > 0.3:  # the stream ended, quiet
                held_at_end = held if gk.resyncs_done == baseline else -2
                stream_end = last_at
        final = len(gk.decider.table)
        if held_at_end == -1:  # never quiet for long enough within the run
            stream_end = last_at
        full_at = next(t for t, h in samples if h == final) - stream_end
        print(
            "got",
            received[b"api"],
            gk.counters.control_lost,
            held_at_end,
            final,
            gk.resyncs_done - baseline,
            f"{max(0.0, full_at):.3f}",
            flush=True,
        )
        await gk.aclose()

    asyncio.run(run())


def late_receiver(accounting: str, control: str, kind: str = "async", want: int = 0) -> None:
    """Role: a gatekeeper (re)started after the stream: how many verdicts its RESYNC
    brings, and how long after it started it holds them all (``want``: this many, else
    its first RESYNCDONE)."""
    from smockron.gatekeeper._asyncio import AsyncGatekeeper
    from smockron.gatekeeper._threaded import Gatekeeper

    def restored(gk: AsyncGatekeeper | Gatekeeper) -> bool:
        return len(gk.decider.table) >= want if want else gk.resyncs_done > 0

    if kind == "threaded":
        start = time.monotonic()
        tgk = Gatekeeper(accounting, control, ["api"], max_entries=4_000_000)
        while not restored(tgk) and time.monotonic() - start < 30:
            time.sleep(0.001)
        print("late", len(tgk.decider.table), f"{time.monotonic() - start:.3f}", flush=True)
        tgk.close()
        return

    async def run() -> None:
        start = time.monotonic()
        gk = AsyncGatekeeper(accounting, control, ["api"], max_entries=4_000_000)
        gk.start()
        while not restored(gk) and time.monotonic() - start < 30:
            await asyncio.sleep(0.001)
        print("late", len(gk.decider.table), f"{time.monotonic() - start:.3f}", flush=True)
        await gk.aclose()

    asyncio.run(run())


def late_run(accounting: str, control: str, kind: str = "async", want: int = 0) -> list[str]:
    """One restarted gatekeeper in a process of its own: ``late_receiver``'s words."""
    return subprocess.run(
        [
            sys.executable,
            __file__,
            "--role",
            "late-gk",
            "--accounting",
            accounting,
            "--control",
            control,
            "--kind",
            kind,
            "--want",
            str(want),
        ],
        capture_output=True,
        text=True,
        env=smockron_env(),
        timeout=90,
    ).stdout.split()


def start_master(
    accounting: str, control: str, log: IO[bytes] | None = None
) -> subprocess.Popen[bytes]:
    """A real master, memory store, one request an hour per identifier."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "smockron",
            "master",
            "--accounting",
            accounting,
            "--control",
            control,
            "--rule",
            "api:1/h:1",
            "--stats-interval",
            "0",
        ],
        stderr=log or subprocess.DEVNULL,
        env=smockron_env(),
    )


def feeder_and_counter(
    accounting: str, control: str
) -> tuple[zmq.Context[zmq.Socket[bytes]], zmq.Socket[bytes], zmq.Socket[bytes]]:
    """A PUB that feeds the master accounting (waiting, never dropping), and a SUB that
    hears its publish counters."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    feeder = ctx.socket(zmq.PUB)
    feeder.setsockopt(zmq.SNDHWM, 20_000)
    feeder.setsockopt(zmq.XPUB_NODROP, 1)
    feeder.connect(accounting)
    counter = ctx.socket(zmq.SUB)
    counter.subscribe(RULES_TOPIC)
    counter.connect(control)
    return ctx, feeder, counter


def feed(feeder: zmq.Socket[bytes], identifiers: int) -> None:
    """Accounting for ``identifiers`` distinct identifiers, each once, as fast as it goes."""
    for start in range(0, identifiers, 10_000):
        now = int(time.time() * 1000)  # fresh: the master drops accounting that is late
        batch = [
            encode_accounting("api", ACCEPTED, b"id-%d" % i, now)
            for i in range(start, min(identifiers, start + 10_000))
        ]
        sent = 0
        while sent < len(batch):  # NODROP: the feeder waits rather than drops
            sent += send_all(feeder, batch[sent:])


def published(counter: zmq.Socket[bytes], at_least: int, timeout: float) -> int:
    """The master's publish count for ``api`` once it reaches ``at_least`` (or timeout)."""
    count, deadline = 0, time.monotonic() + timeout
    while count < at_least and time.monotonic() < deadline:
        if counter.poll(200):
            frames = counter.recv_multipart()
            if frames[1] == PUBLISHED:
                count = max(count, decode_published(frames)[1])
    return count


def resync_sizes(log: IO[bytes]) -> list[int]:
    """The DELAY_UNTILs of each resync the master logged."""
    log.seek(0)
    return [
        int(m[1])
        for m in re.finditer(rb"resync of api(?: \(private\))?: (\d+) DELAY_UNTIL", log.read())
    ]


def resync_main(sizes: list[int], rounds: int) -> None:
    """Time for a restarted gatekeeper to hold a master's ``size`` live delays."""
    print(
        f"RESYNC restore: a real master holding N live delays (api:1/h:1), a gatekeeper "
        f"started afresh {rounds} times; seconds from its start until it holds all N "
        f"(median; goal <= 1 s)"
    )
    for size in sizes:
        acc, ctl = free_port(), free_port()
        accounting, control = f"tcp://127.0.0.1:{acc}", f"tcp://127.0.0.1:{ctl}"
        log = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
        master = start_master(accounting, control, log)
        ctx, feeder, counter = feeder_and_counter(accounting, control)
        try:
            deadline = time.monotonic() + 10
            while (probes := published(counter, 1, 0.3)) == 0 and time.monotonic() < deadline:
                feeder.send_multipart(
                    encode_accounting("api", ACCEPTED, b"probe", int(time.time() * 1000))
                )
            time.sleep(BACKLOG_MS / 1000)  # past the backlog rule: nothing counts as late
            feed(feeder, size)
            got = published(counter, probes + size, size / 20_000 + 30)
            if got < probes + size:
                print(f"  {size:>9,}: the master published only {got - probes:,}")
                continue
            # what one resync sends (the master's log says): the target of the timed ones
            first = late_run(accounting, control)
            live = resync_sizes(log)[0]
            print(
                f"  {size:>9,} fed: a resync sends {live:,}, a first gatekeeper held "
                f"{first[1]} at its end",
                flush=True,
            )
            for kind in ("async", "threaded"):
                runs = [late_run(accounting, control, kind, live) for _ in range(rounds)]
                times = [float(r[2]) for r in runs]
                held = statistics.median(float(r[1]) for r in runs)
                median = statistics.median(times)
                print(
                    f"  {size:>9,} live, {kind:8}: held {held:,.0f} "
                    f"after {median:.3f} s (rounds: {', '.join(f'{t:.3f}' for t in times)})"
                    f"  goal <= 1 s: {'MET' if median <= 1.0 and held >= live else 'NOT MET'}",
                    flush=True,
                )
            print(
                f"  resyncs the master sent: {len(resync_sizes(log))} (asked: {1 + 2 * rounds}; "
                "more: a gatekeeper lost some and asked again)"
            )
        finally:
            master.terminate()
            master.wait(30)
            feeder.close(0)
            counter.close(0)
            ctx.term()
            log.close()


def master_round(gatekeepers: int, identifiers: int) -> dict[str, float]:
    """One run against a real master; the worst gatekeeper's figures."""
    acc, ctl = free_port(), free_port()
    accounting, control = f"tcp://127.0.0.1:{acc}", f"tcp://127.0.0.1:{ctl}"
    master = start_master(accounting, control)
    seconds = identifiers / 20_000 + 6.0
    role = [
        sys.executable,
        __file__,
        "--role",
        "master-gk",
        "--accounting",
        accounting,
        "--control",
        control,
        "--seconds",
        str(seconds),
    ]
    procs = [
        subprocess.Popen(role, stdout=subprocess.PIPE, text=True, env=smockron_env())
        for _ in range(gatekeepers)
    ]
    ctx, feeder, counter = feeder_and_counter(accounting, control)
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        feed(feeder, identifiers)
        rows = []
        for p in procs:
            assert p.stdout is not None
            rows.append([float(x) for x in p.stdout.readline().split()[1:]])
        published = 0
        while counter.poll(0):
            frames = counter.recv_multipart()
            if frames[1] == PUBLISHED:
                published = max(published, decode_published(frames)[1])
        late = late_run(accounting, control)
        worst = min(rows, key=lambda r: r[0])
        return {
            "published": published,
            "received": worst[0],
            "lost": worst[1],
            "held_at_end": worst[2],
            "held": worst[3],
            "resyncs": worst[4],
            "full_after_s": worst[5],
            "late_held": float(late[1]),
            "late_s": float(late[2]),
        }
    finally:
        for p in procs:
            p.wait(60)
        master.terminate()
        master.wait(30)
        feeder.close(0)
        counter.close(0)
        ctx.term()


def master_main(identifiers: int, rounds: int) -> None:
    print(
        f"real master, {identifiers:,} identifiers each delayed once (api:1/h:1), "
        f"medians of {rounds}; worst gatekeeper of each round"
    )
    for n in (1, 4):
        runs = [master_round(n, identifiers) for _ in range(rounds)]

        def med(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        print(
            f"  x{n}: published {med('published'):,.0f}, received {med('received'):,.0f} "
            f"({med('received') / max(1.0, med('published')):.2%}), control_lost "
            f"{med('lost'):,.0f}; identifiers held when the stream ended "
            f"{med('held_at_end'):,.0f}, after {med('resyncs'):.0f} resync(s) "
            f"{med('held'):,.0f}, {med(FULL):.2f} s after the stream ended "
            f"(rounds: {', '.join(f'{r[FULL]:.2f}' for r in runs)}); a gatekeeper "
            f"started afterwards held {med('late_held'):,.0f} by RESYNC "
            f"{med('late_s'):.2f} s after it started "
            f"(rounds: {', '.join(f'{r[LATE]:.2f}' for r in runs)})"
        )


def one_round(kind: str, gatekeepers: int, messages: int, rate: float) -> list[float]:
    port = free_port()
    control = f"tcp://127.0.0.1:{port}"
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 100_000)  # the master's default --hwm
    pub.bind(control)
    seconds = messages / rate + 2.0
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--role",
                kind,
                "--control",
                control,
                "--seconds",
                str(seconds),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=smockron_env(),
        )
        for _ in range(gatekeepers)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # subscriptions reach the publisher
        far = int(time.time() * 1000) + 3_600_000
        batch = [encode_control("api", b"id-%d" % i, far) for i in range(1000)]
        start = time.perf_counter()
        sent = 0
        for k in range(messages // 1000):
            due = start + k * 1000 / rate
            while time.perf_counter() < due:
                time.sleep(0)
            sent += send_all(pub, batch)
        got = []
        for p in procs:
            assert p.stdout is not None
            got.append(int(p.stdout.readline().split()[1]))
        return [g / sent for g in got]
    finally:
        for p in procs:
            p.wait(30)
        pub.close(0)
        ctx.term()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role")
    parser.add_argument("--control")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=200_000.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--master", action="store_true")
    parser.add_argument("--accounting")
    parser.add_argument("--identifiers", type=int, default=1_000_000)
    parser.add_argument("--resync", help="live delays to restore, e.g. 100000,1000000")
    parser.add_argument("--kind", default="async")
    parser.add_argument("--want", type=int, default=0)
    args = parser.parse_args()
    if args.role == "late-gk":
        late_receiver(args.accounting, args.control, args.kind, args.want)
        return
    if args.resync:
        resync_main([int(n) for n in args.resync.split(",")], args.rounds)
        return
    if args.role == "master-gk":
        master_receiver(args.accounting, args.control, args.seconds)
        return
    if args.role:
        receiver(args.role, args.control, args.seconds)
        return
    if args.master:
        master_main(args.identifiers, args.rounds)
        return
    print(f"{args.messages:,} DELAY_UNTILs at {args.rate:,.0f}/s, medians of {args.rounds}")
    for kind in ("raw", "async", "threaded"):
        for n in (1, 4):
            shares = [min(one_round(kind, n, args.messages, args.rate)) for _ in range(args.rounds)]
            median = statistics.median(shares)
            goal = (
                ""
                if kind == "raw"
                else f"  goal >= 99.9%: {'MET' if median >= 0.999 else 'NOT MET'}"
            )
            print(
                f"  {kind:8} x{n}: worst gatekeeper received {median:.2%} "
                f"(rounds {', '.join(f'{s:.2%}' for s in shares)}){goal}"
            )


if __name__ == "__main__":
    main()
