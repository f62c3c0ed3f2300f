"""What the Python client costs on top of the generated gRPC stub.

Run: python bench/client.py [--seconds 1] [--runs 3]. Starts one real ``smockron cluster``
node on loopback and measures, one call in flight, each as the median of ``--runs``:

* single checks/s: ``Client.check`` vs the raw sync stub with a prebuilt message, and
  ``AsyncClient.check`` vs the raw grpc.aio stub (the baselines, measured in the same run);
* checks/s with 1,000 checks per call: ``get_rate_limits`` (model -> protobuf conversion
  included) vs the raw stub sending one prebuilt 1,000-item message.

The ratio is client / raw: 1.00 means the client adds nothing measurable.

Then the client CPU per check (this process's CPU time / checks), against the ``limits``
library on Redis (installed by this script if missing; a redis-server on a free port):

* coalesced: 100 concurrent checks at a time, asyncio tasks on one AsyncClient and
  threads on one Client (goal <= 20 us per check). Threads twice: 100 long-lived
  threads each checking in a loop (a threaded server's workers), and rounds of 100
  checks handed to a 100-thread ThreadPoolExecutor, whose own hand-off is counted too
  (it costs ~20-50 us per item here without any client: the ``pool.map, no client``
  line measures it, items that block once each as a check does, on a 0.2 ms sleep).
  The looping threads' own cost of blocking once per check is measured too: the same
  100 threads looping on a 0.3 ms sleep instead of a check (``no client``). The
  client's own CPU is each case minus its ``no client`` line, taken per run, then the
  median of the runs: what the client adds to a threaded application. Each threaded
  case and its ``no client`` twin run in alternating slices (a tenth of ``--seconds``
  each for the pool, a fifth for the looping threads), so that both see the same load
  of a shared machine;
* sequential: one check at a time, Client.check and AsyncClient.check, against
  ``limits``' FixedWindowRateLimiter.hit on Redis (goal: no more than it; AsyncClient
  against limits' asyncio hit, and also against its sync hit). Both clients twice:
  given the node's HTTP gateway (``http_address``; lone checks then go over HTTP/1.1
  keep-alive, the clients' choice) and on gRPC only. When uvloop is installed, the
  asyncio cases given ``http_address`` and limits' asyncio hit run once more on uvloop
  (the loop smockron's daemons use), their ratio taken on the same loop.

Ratios to limits are per run (same run, same machine load), then their median.

Every gRPC case runs on the client's default transport: the native libgrpc++ channel
when smockron.cluster._nativeclient is built (the header line says which), and the
sequential cases once more with ``native=False`` (grpcio), for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from smockron.cluster.client import MINUTE, NATIVE_AVAILABLE, AsyncClient, Client
from smockron.cluster.model import RateLimitRequest
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.cluster.pb import gubernator_pb2_grpc
from tests.support import free_ports, run_smockron, start_redis, wait_port

pb_grpc: Any = gubernator_pb2_grpc
BATCH = 1000

LOOPING_HTTP = "coalesced: 100 threads looping on one Client, http_address given"
LOOPING = "coalesced: 100 threads looping on one Client"
POOL = "coalesced: 100 pool.map items on one Client"
BASELINES = {  # each threaded case: the same threads without a client, measured beside it
    LOOPING_HTTP: "(100 threads looping, no client: sleeping 0.3 ms each, beside the HTTP case)",
    LOOPING: "(100 threads looping, no client: sleeping 0.3 ms each, beside the gRPC case)",
    POOL: "(pool.map, no client: 100 items sleeping 0.2 ms)",
}


def rate(fn: Callable[[], int], seconds: float) -> float:
    """Checks per second of calling ``fn`` (which returns checks done) for ``seconds``."""
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        done += fn()
    return done / elapsed


async def arate(fn: Callable[[], Awaitable[int]], seconds: float) -> float:
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        done += await fn()
    return done / elapsed


def requests(n: int) -> list[RateLimitRequest]:
    # a huge limit so nothing is ever over: every call does the same work
    return [RateLimitRequest("bench", f"k{i}", 1, 10**12, MINUTE) for i in range(n)]


def pb_batch(n: int) -> pb.GetRateLimitsReq:
    return pb.GetRateLimitsReq(
        requests=[
            pb.RateLimitReq(name="bench", unique_key=f"k{i}", hits=1, limit=10**12, duration=MINUTE)
            for i in range(n)
        ]
    )


def sync_rates(address: str, seconds: float) -> dict[str, float]:
    one, many = pb_batch(1), pb_batch(BATCH)
    reqs = requests(BATCH)
    with grpc.insecure_channel(address) as channel, Client(address) as client:
        stub = pb_grpc.V1Stub(channel)

        def raw_one() -> int:
            stub.GetRateLimits(one, timeout=5)
            return 1

        def client_one() -> int:
            client.check("bench", "k0", 1, 10**12, MINUTE)
            return 1

        def raw_many() -> int:
            stub.GetRateLimits(many, timeout=5)
            return BATCH

        def client_many() -> int:
            client.get_rate_limits(reqs)
            return BATCH

        return {
            "sync single: raw stub": rate(raw_one, seconds),
            "sync single: Client.check": rate(client_one, seconds),
            "sync 1000/call: raw stub": rate(raw_many, seconds),
            "sync 1000/call: Client.get_rate_limits": rate(client_many, seconds),
        }


async def async_rates(address: str, seconds: float) -> dict[str, float]:
    one = pb_batch(1)
    async with grpc.aio.insecure_channel(address) as channel, AsyncClient(address) as client:
        stub = pb_grpc.V1Stub(channel)

        async def raw_one() -> int:
            await stub.GetRateLimits(one, timeout=5)
            return 1

        async def client_one() -> int:
            await client.check("bench", "k0", 1, 10**12, MINUTE)
            return 1

        return {
            "async single: raw grpc.aio stub": await arate(raw_one, seconds),
            "async single: AsyncClient.check": await arate(client_one, seconds),
        }


def cpu_per_check(fn: Callable[[], int], seconds: float) -> float:
    """Microseconds of this process's CPU per check while calling ``fn`` for ``seconds``."""
    done, cpu, start = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - start < seconds:
        done += fn()
    return (time.process_time() - cpu) / done * 1e6


def paired_cpu(
    fn: Callable[[], int], base: Callable[[], int], seconds: float, slices: int = 10
) -> tuple[float, float]:
    """``cpu_per_check`` of ``fn`` and of ``base``, each for ``seconds`` in all, run in
    alternating slices (on a shared machine, one run's load changes within a second)."""
    done, cpu = [0, 0], [0.0, 0.0]
    for _ in range(slices):
        for i, f in enumerate((fn, base)):
            start_cpu, start = time.process_time(), time.perf_counter()
            while time.perf_counter() - start < seconds / slices:
                done[i] += f()
            cpu[i] += time.process_time() - start_cpu
    return cpu[0] / done[0] * 1e6, cpu[1] / done[1] * 1e6


def threads_cpu(client: Client | None, seconds: float, threads: int = 100) -> float:
    """CPU per check of ``threads`` threads each calling ``client.check`` in a loop for
    ``seconds`` (at most 100,000 checks each); without a client, each sleeps 0.3 ms (a
    round trip) instead: the threads' own cost of blocking once per check."""
    counts = [0] * threads
    stop = [0.0]  # set once every thread has started: the timing starts at the gate
    start_gate = threading.Barrier(threads + 1)

    def worker(i: int) -> None:
        start_gate.wait()
        done = 0
        key = f"k{i}"
        while time.perf_counter() < stop[0] and done < 100_000:
            if client is None:
                time.sleep(0.0003)
            else:
                client.check("bench", key, 1, 10**12, MINUTE)
            done += 1
        counts[i] = done

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    cpu = time.process_time()
    stop[0] = time.perf_counter() + seconds
    start_gate.wait()
    for t in pool:
        t.join()
    return (time.process_time() - cpu) / sum(counts) * 1e6


def paired_threads_cpu(client: Client, seconds: float, slices: int = 5) -> tuple[float, float]:
    """``threads_cpu`` with ``client`` and without (sleeping), each for ``seconds`` in
    all, in alternating slices (as ``paired_cpu``)."""
    mine = [threads_cpu(c, seconds / slices) for _ in range(slices) for c in (client, None)]
    return statistics.mean(mine[::2]), statistics.mean(mine[1::2])


async def aseq_cpu(client: AsyncClient, seconds: float) -> float:
    """Microseconds of CPU per ``client.check``, one at a time, for ``seconds``."""
    loop = asyncio.get_running_loop()
    await client.check("bench", "k0", 1, 10**12, MINUTE)  # connect outside the timing
    done, cpu, start = 0, time.process_time(), loop.time()
    while loop.time() - start < seconds:
        await client.check("bench", "k0", 1, 10**12, MINUTE)
        done += 1
    return (time.process_time() - cpu) / done * 1e6


def async_http_cpu(
    address: str, http_address: str, redis_url: str, seconds: float, uvloop: bool
) -> dict[str, float]:
    """AsyncClient.check given ``http_address`` and limits' asyncio hit, one at a time,
    on a fresh loop (uvloop's if ``uvloop``)."""
    suffix = ", uvloop" if uvloop else ""

    async def run() -> dict[str, float]:
        async with AsyncClient(address, http_address=http_address) as client:
            mine = await aseq_cpu(client, seconds)
        return {
            f"sequential: AsyncClient.check, http_address given (HTTP){suffix}": mine,
            f"sequential: limits on Redis, asyncio hit(){suffix}": await alimits_cpu(
                redis_url, seconds
            ),
        }

    if uvloop:
        import uvloop as uv

        return uv.run(run())
    return asyncio.run(run())


def client_cpu(address: str, http_address: str, seconds: float) -> dict[str, float]:
    from concurrent.futures import ThreadPoolExecutor

    out: dict[str, float] = {}
    with Client(address, http_address=http_address) as client:

        def one_http() -> int:
            client.check("bench", "k0", 1, 10**12, MINUTE)
            return 1

        out["sequential: Client.check, http_address given (HTTP)"] = cpu_per_check(
            one_http, seconds
        )
        out[LOOPING_HTTP], out[BASELINES[LOOPING_HTTP]] = paired_threads_cpu(client, seconds)
    with Client(address, http_address=http_address, transport="http") as client:
        out["(coalesced: 100 threads looping, batches over HTTP too)"] = threads_cpu(
            client, seconds
        )
    with Client(address) as client, ThreadPoolExecutor(100) as pool:

        def one() -> int:
            client.check("bench", "k0", 1, 10**12, MINUTE)
            return 1

        def hundred_threads() -> int:
            list(pool.map(lambda i: client.check("bench", f"k{i}", 1, 10**12, MINUTE), range(100)))
            return 100

        def pool_alone() -> int:
            list(pool.map(lambda i: time.sleep(0.0002), range(100)))
            return 100

        out["sequential: Client.check on gRPC"] = cpu_per_check(one, seconds)
        out[LOOPING], out[BASELINES[LOOPING]] = paired_threads_cpu(client, seconds)
        hundred_threads()  # the pool's threads started outside the timing
        out[POOL], out[BASELINES[POOL]] = paired_cpu(hundred_threads, pool_alone, seconds)
    with Client(address, native=False) as grpcio_client:

        def one_grpcio() -> int:
            grpcio_client.check("bench", "k0", 1, 10**12, MINUTE)
            return 1

        out["(sequential: Client.check over grpcio)"] = cpu_per_check(one_grpcio, seconds)
        out["(coalesced: 100 threads looping, over grpcio)"] = threads_cpu(grpcio_client, seconds)

    async def run_async() -> None:
        async with AsyncClient(address, native=False) as grpcio_client:
            loop = asyncio.get_running_loop()
            done, cpu, start = 0, time.process_time(), loop.time()
            while loop.time() - start < seconds:
                await grpcio_client.check("bench", "k0", 1, 10**12, MINUTE)
                done += 1
            out["(sequential: AsyncClient.check over grpcio)"] = (
                (time.process_time() - cpu) / done * 1e6
            )
            done, cpu, start = 0, time.process_time(), loop.time()
            while loop.time() - start < seconds:
                await asyncio.gather(
                    *(grpcio_client.check("bench", f"k{i}", 1, 10**12, MINUTE) for i in range(100))
                )
                done += 100
            out["(coalesced: 100 asyncio tasks, over grpcio)"] = (
                (time.process_time() - cpu) / done * 1e6
            )
        async with AsyncClient(address) as client:
            loop = asyncio.get_running_loop()

            async def hundred() -> None:
                await asyncio.gather(
                    *(client.check("bench", f"k{i}", 1, 10**12, MINUTE) for i in range(100))
                )

            async def one() -> None:
                await client.check("bench", "k0", 1, 10**12, MINUTE)

            cases = (
                ("coalesced: 100 asyncio tasks on one AsyncClient", hundred, 100),
                ("sequential: AsyncClient.check on gRPC", one, 1),
            )
            for name, coro, n in cases:
                done, cpu, start = 0, time.process_time(), loop.time()
                while loop.time() - start < seconds:
                    await coro()
                    done += n
                out[name] = (time.process_time() - cpu) / done * 1e6

    asyncio.run(run_async())
    return out


def limits_cpu(redis_url: str, seconds: float) -> float:
    from limits import parse
    from limits.storage import storage_from_string
    from limits.strategies import FixedWindowRateLimiter

    limiter = FixedWindowRateLimiter(storage_from_string(redis_url))
    item = parse("1000000000/minute")

    def one() -> int:
        limiter.hit(item, "bench", "k0")
        return 1

    return cpu_per_check(one, seconds)


async def alimits_cpu(redis_url: str, seconds: float) -> float:
    """``limits``' asyncio FixedWindowRateLimiter (redis.asyncio), one hit at a time, on
    the running loop."""
    from limits import parse
    from limits.aio.storage import RedisStorage
    from limits.aio.strategies import FixedWindowRateLimiter

    url = redis_url.replace("redis://", "async+redis://", 1)
    limiter = FixedWindowRateLimiter(RedisStorage(url, implementation="redispy"))
    item = parse("1000000000/minute")
    loop = asyncio.get_running_loop()
    await limiter.hit(item, "bench", "k0")
    done, cpu, start = 0, time.process_time(), loop.time()
    while loop.time() - start < seconds:
        await limiter.hit(item, "bench", "k0")
        done += 1
    return (time.process_time() - cpu) / done * 1e6


def has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def ensure_limits() -> None:
    try:
        import limits  # noqa: F401
    except ImportError:
        import subprocess

        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "limits"], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    ensure_limits()
    grpc_port, http_port = free_ports(2)
    address = f"127.0.0.1:{grpc_port}"
    cpu: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        proc = run_smockron(
            ["cluster", "--grpc-address", address, "--http-address", f"127.0.0.1:{http_port}"],
            Path(tmp) / "node.log",
        )
        redis = start_redis(Path(tmp))
        try:
            wait_port(grpc_port, 20)
            wait_port(http_port, 20)
            runs: dict[str, list[float]] = {}
            for _ in range(args.runs):
                found = sync_rates(address, args.seconds)
                found |= asyncio.run(async_rates(address, args.seconds))
                for name, value in found.items():
                    runs.setdefault(name, []).append(value)
                found_cpu = client_cpu(address, f"127.0.0.1:{http_port}", args.seconds)
                for name, value in found_cpu.items():
                    cpu.setdefault(name, []).append(value)
                cpu.setdefault("sequential: limits on Redis, hit()", []).append(
                    limits_cpu(redis.url, args.seconds)
                )
                for uvloop in (False, True) if has_uvloop() else (False,):
                    found_cpu = async_http_cpu(
                        address, f"127.0.0.1:{http_port}", redis.url, args.seconds, uvloop
                    )
                    for name, value in found_cpu.items():
                        cpu.setdefault(name, []).append(value)
        finally:
            redis.stop()
            proc.stop()

    medians = {name: statistics.median(values) for name, values in runs.items()}
    print(f"median of {args.runs} runs x {args.seconds:.1f}s, one call in flight")
    for name, value in medians.items():
        print(f"  {name:45s} {value:>10,.0f} checks/s")
    pairs = [
        ("sync single", "sync single: Client.check", "sync single: raw stub"),
        ("async single", "async single: AsyncClient.check", "async single: raw grpc.aio stub"),
        ("sync 1000/call", "sync 1000/call: Client.get_rate_limits", "sync 1000/call: raw stub"),
    ]
    for label, mine, raw in pairs:
        print(f"  ratio client/raw, {label:20s} {medians[mine] / medians[raw]:.2f}")
    cpu_medians = {name: statistics.median(values) for name, values in cpu.items()}
    transport = "native libgrpc++ channel" if NATIVE_AVAILABLE else "grpcio (native not built)"
    print(f"client CPU per check, median of {args.runs} runs x {args.seconds:.1f}s, {transport}")
    for name, value in cpu_medians.items():
        runs_us = " ".join(f"{v:.0f}" for v in cpu[name])
        print(f"  {name:50s} {value:8.1f} us  (runs: {runs_us})")
    sync_hit = "sequential: limits on Redis, hit()"

    def ratios(name: str, base: str) -> tuple[float, str]:
        """The median of each run's ratio of ``name`` to ``base``, and the ratios."""
        each = [mine / theirs for mine, theirs in zip(cpu[name], cpu[base], strict=True)]
        return statistics.median(each), ", ".join(f"{r:.2f}" for r in each)

    for name, value in cpu_medians.items():
        if name.startswith("("):
            continue  # for comparison only
        if name.startswith("coalesced"):
            print(f"  goal <= 20 us, {name}: {'MET' if value <= 20 else 'NOT MET'} (all CPU)")
            if name in BASELINES:
                structure = BASELINES[name]
                # what the client adds to the application's own threads: each run's
                # difference to the same threads without a client, then their median
                owns = [a - b for a, b in zip(cpu[name], cpu[structure], strict=True)]
                own = statistics.median(owns)
                verdict = "MET" if own <= 20 else "NOT MET"
                runs_us = " ".join(f"{v:.1f}" for v in owns)
                print(
                    f"    the client's own CPU (minus the same threads without a client, "
                    f"per run): {own:.1f} us: {verdict} (runs: {runs_us})"
                )
        elif "limits" not in name:
            # each run's ratio to limits measured in that run, then their median; the
            # AsyncClient's goal is limits' asyncio hit, on the same loop
            base = sync_hit
            if "Async" in name:
                base = "sequential: limits on Redis, asyncio hit()"
                base += ", uvloop" if name.endswith("uvloop") else ""
            ratio, each = ratios(name, base)
            verdict = "MET" if ratio <= 1 else "NOT MET"
            print(
                f"  goal <= {base.removeprefix('sequential: ')} ({cpu_medians[base]:.1f} us), "
                f"{name}: {verdict} (median of per-run ratios {ratio:.2f}x: {each})"
            )
            if base != sync_hit:
                ratio, each = ratios(name, sync_hit)
                print(f"    (vs limits' sync hit: {ratio:.2f}x: {each})")


if __name__ == "__main__":
    main()
