"""Throughput and latency of a smockron cluster node through gRPC and HTTP/JSON.

Run: python bench/cluster.py [--seconds 3] [--runs 3]. Starts real ``smockron cluster``
processes on loopback and drives them from this process (grpc.aio / aiohttp clients,
so client cost is included). Prints medians of ``--runs`` runs:

1. gRPC checks/s to a single node, 100 and 1,000 checks per GetRateLimits call, one call
   in flight (grpc.aio clients lose throughput with more concurrent calls on one channel
   on this machine, even against a server returning a constant); baselines measured in
   the same run: the in-process LocalLimiter.check ceiling and empty LiveCheck calls/s
   (the gRPC stack's own ceiling on this machine);
2. the same through a non-owner of a 3-node cluster (every check forwarded, BATCHING);
3. p50/p99 latency of single-check calls sent open-loop at 500 and 2,000 calls/s, with the
   server's and the client's CPU per call (/proc/PID/stat, getrusage) and the idle
   (sequential) round trip. The load generator is a separate process, bench/loadgen/
   loadgen.cc: the C++ gRPC client (code generated from smockron's own gubernator.proto,
   built on first use into bench/loadgen/build/; needs the Debian packages g++,
   pkg-config, libgrpc++-dev, protobuf-compiler, protobuf-compiler-grpc), sending every call
   at its scheduled time whatever the answers and checking each answer. Why: the grpc.aio
   client in this process cost ~0.3-0.45 ms of CPU per call, as much as the server under
   test, so on two cores it competed with the server and its own event loop queued the
   calls; the C++ client costs ~0.1-0.2 ms. Reported twice: unpinned, and pinned (server,
   all its threads, on CPU 1; load generator on CPU 0), which stands for production, where
   clients run on other machines. Without g++/libgrpc++-dev the old in-process grpc.aio
   loop is used and said so;
4. HTTP/JSON checks/s (100 per POST) and single-check calls/s;
5. GLOBAL accuracy: 3 nodes, single hits round-robin at 5x the limit (limit 100, 500 calls
   at 500 calls/s, one window, a fresh key per round), admitted vs the exact oracle
   (= limit) and the over-admission in percent, medians of the rounds; also the calls
   refused before the limit was used up (under-admission); next to the same load without
   GLOBAL (forwarded to the owner: exact). ``--only-global`` runs this part alone.
6. ``--client``: smockron's own Python client (``smockron.cluster.Client``, which sends
   each check to its owner) against 1 node and against 3 nodes: sequential single
   checks (checks/s, p50, server CPU per check summed over every node, client CPU per
   check) and 100-check calls (split by owner, sent in parallel); on the 3-node cluster
   with routing off, checks sent to their owner (local) and to a non-owner (forwarded),
   p50 and server CPU; ``AsyncClient.check`` one at a time against the sync client's
   CPU; single checks from ``THREADS`` threads sharing one client (a threaded
   application: the client puts concurrent checks for one node in one call), 1 node
   against 3; and 1 node paced as one node of three is (after each check a pause of twice the
   round's 1-node p50, while a routing client would call the two other nodes), since a
   node answering after an idle pause spends more CPU per check than one kept busy. Every
   figure a median of ``--runs`` rounds, the rounds interleaved, ratios against the
   baseline of the same run.
Goals (issue 5): >= 20,000 checks/s per node via gRPC; p99 < 1 ms at 2,000 calls/s.
``--grpc-server threads|asyncio|native`` picks the nodes' gRPC server (default: the node's own).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import cpu_seconds, median

from smockron.cluster.local import LocalLimiter
from smockron.cluster.model import RateLimitRequest
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc
from smockron.core.hashring import HashRing
from tests.support import Proc, free_ports, run_smockron, wait_port

BATCH, IN_FLIGHT = 100, 1
THREADS = 8
"""Callers sharing one client in the concurrent case of ``--client``."""
GRPC_SERVER: list[str] = []
"""Extra ``smockron cluster`` arguments (``--grpc-server X``)."""
LOADGEN_DIR = Path(__file__).resolve().parent / "loadgen"
PROTO_DIR = Path(__file__).resolve().parent.parent / "smockron" / "cluster" / "proto"


class NodeAddr(NamedTuple):
    grpc: str
    http_port: int
    pid: int


@contextlib.contextmanager
def cluster(n: int, workdir: Path) -> Iterator[list[NodeAddr]]:
    ports = free_ports(2 * n)
    grpc_addrs = [f"127.0.0.1:{p}" for p in ports[:n]]
    procs: list[Proc] = []
    try:
        for i in range(n):
            http = f"127.0.0.1:{ports[n + i]}"
            args = [
                "cluster",
                "--grpc-address",
                grpc_addrs[i],
                "--http-address",
                http,
                "--peers",
                ",".join(grpc_addrs),
                *GRPC_SERVER,
            ]
            procs.append(run_smockron(args, workdir / f"bench-node{i}.log"))
        for p in ports:
            wait_port(p, 20)
        yield [
            NodeAddr(a, p, proc.popen.pid)
            for a, p, proc in zip(grpc_addrs, ports[n:], procs, strict=True)
        ]
    finally:
        for proc in procs:
            proc.stop()


def reqs_for(keys: list[str]) -> pb.GetRateLimitsReq:
    return pb.GetRateLimitsReq(
        requests=[
            pb.RateLimitReq(name="b", unique_key=k, hits=1, limit=10**9, duration=60_000)
            for k in keys
        ]
    )


async def closed_loop(call: Callable[[], Awaitable[int]], seconds: float) -> float:
    """Items per second with IN_FLIGHT concurrent callers for ``seconds``."""
    done = 0
    end = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < end:
            done += await call()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    return done / (time.perf_counter() - start)


async def live_checks(address: str, seconds: float) -> float:
    async with grpc.aio.insecure_channel(address) as channel:
        stub: Any = gubernator_pb2_grpc.V1Stub(channel)  # type: ignore[no-untyped-call]

        async def call() -> int:
            await stub.LiveCheck(pb.LiveCheckReq())
            return 1

        await closed_loop(call, 0.3)
        return await closed_loop(call, seconds)


async def grpc_throughput(
    address: str, keys: list[str], seconds: float, batch: int = BATCH
) -> float:
    async with grpc.aio.insecure_channel(address) as channel:
        stub: Any = gubernator_pb2_grpc.V1Stub(channel)  # type: ignore[no-untyped-call]
        batches = [reqs_for(keys[i : i + batch]) for i in range(0, len(keys), batch)]
        counter = iter(range(10**12))

        async def call() -> int:
            msg = batches[next(counter) % len(batches)]
            resp = await stub.GetRateLimits(msg)
            assert not resp.responses[0].error, resp.responses[0].error
            return len(resp.responses)

        await closed_loop(call, 0.3)  # warm up
        return await closed_loop(call, seconds)


async def grpc_latency(address: str, rate: float, seconds: float) -> tuple[float, float]:
    """p50, p99 in ms of single-check calls sent open-loop at ``rate`` per second."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub: Any = gubernator_pb2_grpc.V1Stub(channel)  # type: ignore[no-untyped-call]
        latencies: list[float] = []
        msgs = [reqs_for([f"lat-{i}"]) for i in range(100)]

        errors: list[str] = []

        async def one(i: int) -> None:
            t0 = time.perf_counter()
            try:
                await stub.GetRateLimits(msgs[i % 100], timeout=5)
            except grpc.aio.AioRpcError as exc:
                errors.append(exc.code().name)
                return
            latencies.append(time.perf_counter() - t0)

        for i in range(200):  # warm up
            await one(i)
        latencies.clear()
        tasks = []
        total = int(rate * seconds)
        start = time.perf_counter()
        for i in range(total):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
        if errors:
            print(f"  ({len(errors)} of {total} calls failed: {sorted(set(errors))})")
        latencies.sort()
        return (
            latencies[len(latencies) // 2] * 1000,
            latencies[int(len(latencies) * 0.99)] * 1000,
        )


async def http_throughput(port: int, batch: int, seconds: float) -> float:
    body = json.dumps(
        {
            "requests": [
                {"name": "h", "unique_key": f"k{i}", "hits": 1, "limit": 10**9, "duration": 60000}
                for i in range(batch)
            ]
        }
    ).encode()
    url = f"http://127.0.0.1:{port}/v1/GetRateLimits"
    async with aiohttp.ClientSession() as session:

        async def call() -> int:
            async with session.post(url, data=body) as resp:
                data = await resp.json()
                return len(data["responses"])

        await closed_loop(call, 0.3)
        return await closed_loop(call, seconds)


class Tally(NamedTuple):
    admitted: int
    early_refusals: int
    """Refused while fewer than ``limit`` hits had been admitted: under-admission."""


async def round_robin(
    addrs: list[str],
    key: str,
    limit: int,
    total: int,
    rate: float,
    behavior: int,
    route: Callable[[int], int] | None = None,
    open_loop: bool = False,
) -> Tally:
    """Single hits at ``rate``/s, call ``i`` to node ``route(i)`` (default: in turn); how
    many were admitted and how many refused too early (the exact oracle admits the first
    ``limit`` and refuses the rest). ``open_loop``: each call sent at its time without
    waiting for the previous answer (early refusals then counted in order of answers)."""
    channels = [grpc.aio.insecure_channel(a) for a in addrs]
    stubs: list[Any] = [gubernator_pb2_grpc.V1Stub(c) for c in channels]  # type: ignore[no-untyped-call]
    msg = pb.GetRateLimitsReq(
        requests=[
            pb.RateLimitReq(
                name="acc",
                unique_key=key,
                hits=1,
                limit=limit,
                duration=60_000,
                behavior=behavior,  # type: ignore[arg-type]
            )
        ]
    )
    admitted = early = 0

    async def one(i: int) -> None:
        nonlocal admitted, early
        node = route(i) if route is not None else i % len(stubs)
        resp = await stubs[node].GetRateLimits(msg, timeout=5)
        if resp.responses[0].status == pb.UNDER_LIMIT:
            admitted += 1
        elif admitted < limit:
            early += 1

    tasks = []
    try:
        start = time.perf_counter()
        for i in range(total):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if open_loop:
                tasks.append(asyncio.create_task(one(i)))
            else:
                await one(i)
        await asyncio.gather(*tasks)
    finally:
        for c in channels:
            await c.close(None)
    return Tally(admitted, early)


def report(label: str, got: list[Tally], limit: int, total: int) -> None:
    over = median([g.admitted - limit for g in got])
    early = median([g.early_refusals for g in got])
    print(
        f"accuracy {label}: admitted {[g.admitted for g in got]} of {total}, oracle {limit}; "
        f"median over-admission {over:.0f} ({over / limit:.1%}), median refusals before "
        f"the limit was used up {early:.0f} {[g.early_refusals for g in got]}"
    )


async def global_accuracy(addrs: list[str], runs: int, limit: int = 100) -> None:
    """Part 5: 5x the limit round-robin, forwarded (exact) and GLOBAL, medians of ``runs``;
    then GLOBAL with traffic moving to the owner, and open loop at 2,000 calls/s."""
    total = 5 * limit
    for behavior, label in ((pb.BATCHING, "forwarded"), (pb.GLOBAL, "GLOBAL")):
        got = [
            await round_robin(addrs, f"acc-{label}-{time.time_ns()}", limit, total, 500.0, behavior)
            for _ in range(runs)
        ]
        report(f"{label:9}, 5x limit round-robin", got, limit, total)
    ring = HashRing(addrs)
    moved = []
    for _ in range(runs):
        key = f"acc-moving-{time.time_ns()}"
        owner = addrs.index(ring.owner(f"acc_{key}"))

        def route(i: int, o: int = owner) -> int:
            return i % 3 if i < 30 else o

        moved.append(await round_robin(addrs, key, limit, total, 500.0, pb.GLOBAL, route=route))
    report("GLOBAL, round-robin, all to the owner after 30 calls", moved, limit, total)
    fast = [
        await round_robin(
            addrs,
            f"acc-open-{time.time_ns()}",
            limit,
            20 * limit,
            2000.0,
            pb.GLOBAL,
            open_loop=True,
        )
        for _ in range(runs)
    ]
    report("GLOBAL, 20x limit round-robin, open loop at 2,000 calls/s", fast, limit, 20 * limit)


def only_global(runs: int) -> None:
    print(f"smockron cluster bench, part 5 only: {runs} rounds, medians")
    with tempfile.TemporaryDirectory() as tmp, cluster(3, Path(tmp)) as nodes:
        asyncio.run(global_accuracy([n.grpc for n in nodes], runs))


def build_loadgen() -> Path | None:
    """The C++ load generator, compiled once; None when protoc/g++/grpc++ are missing."""
    out = LOADGEN_DIR / "build"
    exe = out / "loadgen"
    sources = [LOADGEN_DIR / "loadgen.cc", PROTO_DIR / "gubernator.proto"]
    if exe.exists() and all(src.stat().st_mtime < exe.stat().st_mtime for src in sources):
        return exe
    plugin = shutil.which("grpc_cpp_plugin")
    if not (shutil.which("protoc") and shutil.which("g++") and plugin):
        return None
    out.mkdir(exist_ok=True)
    try:
        subprocess.run(
            [
                "protoc",
                f"-I{PROTO_DIR}",
                f"--cpp_out={out}",
                f"--grpc_out={out}",
                f"--plugin=protoc-gen-grpc={plugin}",
                str(PROTO_DIR / "gubernator.proto"),
            ],
            check=True,
        )
        flags = subprocess.run(
            ["pkg-config", "--cflags", "--libs", "grpc++", "protobuf"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        subprocess.run(
            [
                "g++",
                "-O2",
                "-std=c++17",
                "-o",
                str(exe),
                str(LOADGEN_DIR / "loadgen.cc"),
                str(out / "gubernator.pb.cc"),
                str(out / "gubernator.grpc.pb.cc"),
                f"-I{out}",
                *flags,
                "-pthread",
            ],
            check=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"  (cannot build the C++ load generator: {exc})")
        return None
    return exe


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (threads started later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(tid), cpus)


def loadgen_latency(
    exe: Path, node: NodeAddr, rate: float, seconds: float, pinned: bool
) -> dict[str, float]:
    """One open-loop run of the C++ load generator against ``node``; its JSON figures."""
    all_cpus = set(range(os.cpu_count() or 1))
    pinnable = pinned and len(all_cpus) >= 2
    pin(node.pid, {1} if pinnable else all_cpus)
    try:
        out = subprocess.run(
            [
                str(exe),
                node.grpc,
                str(node.pid),
                str(rate),
                str(seconds),
                "1000",
                "0" if pinnable else "-1",
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=seconds + 60,
        ).stdout
    finally:
        pin(node.pid, all_cpus)
    result: dict[str, Any] = json.loads(out)
    if result["failed"]:
        codes = str(result.get("failed_codes", "")).strip() or "no answer in time"
        print(f"  ({result['failed']:.0f} calls failed; gRPC status codes: {codes})")
    return result


def latency_part(node: NodeAddr, seconds: float, runs: int) -> None:
    exe = build_loadgen()
    if exe is None:
        print(
            "  (no C++ load generator: in-process grpc.aio client, not comparable; it needs"
            " apt-get install g++ pkg-config libgrpc++-dev protobuf-compiler"
            " protobuf-compiler-grpc)"
        )
        for target in (500, 2000):
            lat = [asyncio.run(grpc_latency(node.grpc, target, seconds)) for _ in range(runs)]
            p50, p99 = median([x[0] for x in lat]), median([x[1] for x in lat])
            print(
                f"gRPC single checks at {target:5,}/s:           p50 {p50:.3f} ms, "
                f"p99 {p99:.3f} ms (goal p99 < 1 ms at 2,000/s)"
            )
        return
    for pinned in (False, True):
        how = "pinned  " if pinned else "unpinned"
        for target in (500, 2000):
            got = [loadgen_latency(exe, node, target, seconds, pinned) for _ in range(runs)]

            def med(key: str, got: list[dict[str, float]] = got) -> float:
                return median([g[key] for g in got])

            p99s = ", ".join(f"{g['p99']:.2f}" for g in got)
            print(
                f"gRPC single checks at {target:5,}/s, {how}: p50 {med('p50'):.3f} ms, "
                f"p99 {med('p99'):.3f} ms [{p99s}] (goal < 1 ms at 2,000/s); CPU per "
                f"call: server {med('server_us'):.0f} us, client {med('client_us'):.0f} us; "
                f"idle round trip p50 {med('seq_p50'):.3f} ms, "
                f"server {med('seq_server_us'):.0f} us"
            )


def local_ceiling() -> float:
    limiter = LocalLimiter()
    reqs = [RateLimitRequest("b", f"k{i}", 1, 10**9, 60_000) for i in range(BATCH)]
    start = time.perf_counter()
    n = 0
    while time.perf_counter() - start < 1.0:
        limiter.check(reqs)
        n += BATCH
    return n / (time.perf_counter() - start)


class Seq(NamedTuple):
    rate: float
    """checks/s"""
    p50_us: float
    server_us: float
    """CPU of every node per check"""
    client_us: float


def _cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) for pid in pids)


def _seq(lat: list[float], wall: float, server: float, client: float, checks: int) -> Seq:
    """A case's figures: ``checks`` over ``wall`` seconds, the median of ``lat`` (one entry
    a call), the servers' and this process's CPU seconds per check."""
    mid = sorted(lat)[len(lat) // 2]
    return Seq(checks / wall, mid * 1e6, server / checks * 1e6, client / checks * 1e6)


def sequential(
    check: Callable[[str], object],
    keys: list[str],
    pids: list[int],
    seconds: float,
    pause: float = 0.0,
) -> Seq:
    """Single checks one after another for ``seconds``; after each, ``pause`` seconds
    of sleep (the rate then counts the checks over the whole time)."""
    for key in keys[:200]:
        check(key)
    lat: list[float] = []
    server0, client0, start = _cpu(pids), time.process_time(), time.perf_counter()
    n, end = len(keys), start + seconds
    while (t := time.perf_counter()) < end:
        check(keys[len(lat) % n])
        lat.append(time.perf_counter() - t)
        if pause:
            time.sleep(pause)
    wall = time.perf_counter() - start
    return _seq(lat, wall, _cpu(pids) - server0, time.process_time() - client0, len(lat))


def concurrent(
    check: Callable[[str], object],
    keys: list[str],
    pids: list[int],
    seconds: float,
    threads: int = THREADS,
) -> Seq:
    """``threads`` callers sharing one client, each making single checks one after
    another for ``seconds`` (a threaded application's request workers): checks/s, p50
    of a check, server CPU and this process's CPU per check."""
    for key in keys[:200]:
        check(key)
    lats: list[list[float]] = [[] for _ in range(threads)]
    start_at = threading.Barrier(threads + 1)

    def caller(i: int) -> None:
        lat, n = lats[i], len(keys)
        start_at.wait()
        end = time.perf_counter() + seconds
        while (t := time.perf_counter()) < end:
            check(keys[(i * 97 + len(lat)) % n])
            lat.append(time.perf_counter() - t)

    workers = [threading.Thread(target=caller, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    server0, client0, start = _cpu(pids), time.process_time(), time.perf_counter()
    start_at.wait()
    for w in workers:
        w.join()
    wall = time.perf_counter() - start
    lat = [x for one in lats for x in one]
    return _seq(lat, wall, _cpu(pids) - server0, time.process_time() - client0, len(lat))


def batched(client: Any, keys: list[str], pids: list[int], seconds: float) -> Seq:
    """100-check get_rate_limits calls one after another (rate in checks/s)."""
    calls = [
        [RateLimitRequest("cb", k, 1, 10**9, 60_000) for k in keys[i : i + BATCH]]
        for i in range(0, len(keys), BATCH)
    ]
    client.get_rate_limits(calls[0])
    lat: list[float] = []
    server0, client0, start = _cpu(pids), time.process_time(), time.perf_counter()
    end = start + seconds
    while (t := time.perf_counter()) < end:
        got = client.get_rate_limits(calls[len(lat) % len(calls)])
        assert not got[0].error, got[0].error
        lat.append(time.perf_counter() - t)
    wall = time.perf_counter() - start
    used = time.process_time() - client0
    return _seq(lat, wall, _cpu(pids) - server0, used, len(lat) * BATCH)


def async_sequential(address: str, keys: list[str], pids: list[int], seconds: float) -> Seq:
    """``await AsyncClient.check`` one at a time."""
    from smockron.cluster.client import AsyncClient

    async def run() -> Seq:
        async with AsyncClient(address) as client:
            for key in keys[:200]:
                await client.check("cb", key, 1, 10**9, 60_000)
            lat: list[float] = []
            server0, client0, start = _cpu(pids), time.process_time(), time.perf_counter()
            n, end = len(keys), start + seconds
            while (t := time.perf_counter()) < end:
                await client.check("cb", keys[len(lat) % n], 1, 10**9, 60_000)
                lat.append(time.perf_counter() - t)
            wall = time.perf_counter() - start
            used = time.process_time() - client0
            return _seq(lat, wall, _cpu(pids) - server0, used, len(lat))

    return asyncio.run(run())


def client_part(seconds: float, runs: int) -> None:
    """Part 6 (see the module docstring)."""
    from smockron.cluster.client import Client

    keys = [f"k{i}" for i in range(1000)]
    print(
        f"smockron's client, 1 vs 3 nodes: {runs} rounds x {seconds}s, medians; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    got: dict[str, list[Seq]] = {}

    def note(label: str, seq: Seq) -> None:
        got.setdefault(label, []).append(seq)

    tmp = Path(tempfile.mkdtemp(prefix="bench-client-"))
    (tmp / "one").mkdir()
    (tmp / "three").mkdir()
    with cluster(1, tmp / "one") as one, cluster(3, tmp / "three") as three:
        one_pids, pids = [one[0].pid], [n.pid for n in three]
        entry = three[0].grpc
        ring = HashRing([n.grpc for n in three])
        local = [k for k in keys if ring.owner(f"cb_{k}") == entry]
        remote = [k for k in keys if ring.owner(f"cb_{k}") != entry]
        for _ in range(runs):
            with Client(one[0].grpc) as c:
                alone = sequential(partial(_check, c), keys, one_pids, seconds)
                note("1 node, single", alone)
                note("1 node, 100/call", batched(c, keys, one_pids, seconds))
                pause = 2 * alone.p50_us / 1e6
                paced = sequential(partial(_check, c), keys, one_pids, seconds, pause)
                note("1 node, single, paced as 1 of 3", paced)
                many = concurrent(partial(_check, c), keys, one_pids, seconds)
                note(f"1 node, single, {THREADS} threads", many)
            with Client(entry) as c:
                note("3 nodes, single", sequential(partial(_check, c), keys, pids, seconds))
                many = concurrent(partial(_check, c), keys, pids, seconds)
                note(f"3 nodes, single, {THREADS} threads", many)
                note("3 nodes, 100/call", batched(c, keys, pids, seconds))
            with Client(entry, route=False) as c:
                check = partial(_check, c)
                note("3 nodes, no routing, local", sequential(check, local, pids, seconds))
                note("3 nodes, no routing, forwarded", sequential(check, remote, pids, seconds))
                note("3 nodes, no routing, 100/call", batched(c, keys, pids, seconds))
            note(
                "1 node, AsyncClient single", async_sequential(one[0].grpc, keys, one_pids, seconds)
            )
    med = {
        label: Seq(*(median([s[i] for s in seqs]) for i in range(4))) for label, seqs in got.items()
    }
    for label, m in med.items():
        print(
            f"  {label:34s} {m.rate:8,.0f} checks/s  p50 {m.p50_us:7.0f} us  server "
            f"{m.server_us:6.1f} us/check  client {m.client_us:6.1f} us/check"
        )
    base, three_s = med["1 node, single"], med["3 nodes, single"]
    b100, t100 = med["1 node, 100/call"], med["3 nodes, 100/call"]
    loc, fwd = med["3 nodes, no routing, local"], med["3 nodes, no routing, forwarded"]
    asy = med["1 node, AsyncClient single"]
    print(
        f"  3 vs 1 node, single checks: rate {three_s.rate / base.rate:.2f}x, server CPU "
        f"{three_s.server_us / base.server_us:.2f}x (goal <= 1.25x)"
    )
    base_t, three_t = (
        med[f"1 node, single, {THREADS} threads"],
        med[f"3 nodes, single, {THREADS} threads"],
    )
    print(
        f"  3 vs 1 node, single checks from {THREADS} threads: rate "
        f"{three_t.rate / base_t.rate:.2f}x, server CPU {three_t.server_us / base_t.server_us:.2f}x"
    )
    paced = med["1 node, single, paced as 1 of 3"]
    print(
        f"  3 nodes vs 1 node paced as 1 of 3, single checks: server CPU "
        f"{three_s.server_us / paced.server_us:.2f}x"
    )
    print(
        f"  3 vs 1 node, 100/call: rate {t100.rate / b100.rate:.2f}x, server CPU "
        f"{t100.server_us / b100.server_us:.2f}x"
    )
    print(
        f"  forwarded vs local p50: {fwd.p50_us / loc.p50_us:.2f}x (goal <= 2x); server CPU "
        f"{fwd.server_us / loc.server_us:.2f}x"
    )
    print(
        f"  AsyncClient vs Client, client CPU per single check: "
        f"{asy.client_us / base.client_us:.2f}x (goal <= 1.5x)"
    )


def _check(client: Any, key: str) -> object:
    return client.check("cb", key, 1, 10**9, 60_000)


def only_latency(seconds: float, runs: int) -> None:
    print(f"smockron cluster bench, part 3 only: {runs} runs x {seconds}s, medians")
    with tempfile.TemporaryDirectory() as tmp, cluster(1, Path(tmp)) as nodes:
        latency_part(nodes[0], seconds, runs)


async def main(seconds: float, runs: int) -> None:
    print(
        f"smockron cluster bench: {runs} runs x {seconds}s, medians; batch {BATCH}, "
        f"{IN_FLIGHT} calls in flight"
    )
    ceiling = median([local_ceiling() for _ in range(runs)])
    print(f"baseline LocalLimiter.check in-process:   {ceiling:10,.0f} checks/s")
    with tempfile.TemporaryDirectory() as tmp:
        with cluster(1, Path(tmp)) as nodes:
            address, http_port, _ = nodes[0]
            keys = [f"k{i}" for i in range(2000)]
            live = median([await live_checks(address, seconds) for _ in range(runs)])
            print(f"baseline empty LiveCheck calls:           {live:10,.0f} calls/s")
            for batch in (1, BATCH, 1000):
                rate = median(
                    [await grpc_throughput(address, keys, seconds, batch) for _ in range(runs)]
                )
                print(
                    f"gRPC, 1 node, {batch:4}/call:              {rate:10,.0f} checks/s "
                    f"({rate / ceiling:.2f}x LocalLimiter, "
                    f"{rate / 20_000:.2f}x goal 20,000)"
                )
                if batch == BATCH:
                    single = rate
            await asyncio.get_running_loop().run_in_executor(
                None, latency_part, nodes[0], seconds, runs
            )
            hb = median([await http_throughput(http_port, BATCH, seconds) for _ in range(runs)])
            print(f"HTTP/JSON, 1 node, {BATCH}/POST:            {hb:10,.0f} checks/s")
            h1 = median([await http_throughput(http_port, 1, seconds) for _ in range(runs)])
            print(f"HTTP/JSON, 1 node, 1/POST:                {h1:10,.0f} checks/s")
        with cluster(3, Path(tmp)) as nodes:
            addrs = [n.grpc for n in nodes]
            ring = HashRing(addrs)
            entry = addrs[0]
            remote = [k for k in (f"k{i}" for i in range(5000)) if ring.owner(f"b_{k}") != entry]
            fwd = median(
                [await grpc_throughput(entry, remote[:1000], seconds) for _ in range(runs)]
            )
            print(
                f"gRPC, 3 nodes, all forwarded, {BATCH}/call:  {fwd:10,.0f} checks/s "
                f"({fwd / single:.2f}x single node)"
            )
            await global_accuracy(addrs, runs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--grpc-server", choices=["threads", "asyncio", "native"])
    parser.add_argument("--only-latency", action="store_true", help="part 3 alone")
    parser.add_argument("--only-global", action="store_true", help="part 5 alone")
    parser.add_argument("--client", action="store_true", help="part 6 alone")
    args = parser.parse_args()
    if args.grpc_server:
        GRPC_SERVER.extend(["--grpc-server", args.grpc_server])
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    if args.only_latency:
        only_latency(args.seconds, args.runs)
    elif args.only_global:
        only_global(args.runs)
    elif args.client:
        client_part(args.seconds, args.runs)
    else:
        asyncio.run(main(args.seconds, args.runs))
