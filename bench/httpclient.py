"""Does the clients' hand-written HTTP/1.1 transport pay? Against httpx and urllib3.

Run: python bench/httpclient.py [--calls 2000] [--rounds 7]. Starts one real ``smockron
cluster`` node with its HTTP gateway on loopback and calls ``POST /v1/GetRateLimits`` as
the Client does (``encode_requests``, the transport's ``post``, ``decode_responses``),
one call in flight, on kept-alive connections, through:

* smockron's ``HttpTransport`` (sync) and ``AsyncHttpTransport`` (asyncio);
* ``httpx.Client`` and ``httpx.AsyncClient`` (keep-alive by default);
* ``urllib3.HTTPConnectionPool`` (sync; keep-alive by default);

for a lone check per call and for batches of 100 checks. Each round runs every case
once, ``--calls`` calls each (a tenth of them for batches), so all cases see the same
machine load; per case the median over rounds of this process's CPU time per call and of
the wall time per call. The ratio is library / smockron: above 1 the library costs more.
The end-to-end ``Client.check`` given ``http_address`` is measured too, for scale.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from importlib.metadata import version
from pathlib import Path

import httpx
import urllib3

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from smockron.cluster.client import MINUTE, Client
from smockron.cluster.client._http import AsyncHttpTransport, HttpTransport
from smockron.cluster.client._httpcodec import decode_responses, encode_requests
from smockron.cluster.model import RateLimitRequest
from tests.support import free_ports, run_smockron, wait_port

PATH = "/v1/GetRateLimits"
HEADERS = {"Content-Type": "application/json"}
TIMEOUT = 5.0
Case = Callable[[], object]
ACase = Callable[[], Awaitable[object]]


def requests(n: int) -> list[RateLimitRequest]:
    """A huge limit, so nothing is ever over: every call does the same work."""
    return [RateLimitRequest("bench", f"k{i}", 1, 10**12, MINUTE) for i in range(n)]


def sync_cases(address: str, batch: list[RateLimitRequest]) -> tuple[dict[str, Case], Case]:
    """Each sync transport's call, and a closer for all of them."""
    mine = HttpTransport(address)
    hx = httpx.Client(base_url=f"http://{address}", headers=HEADERS, timeout=TIMEOUT)
    host, port = address.rsplit(":", 1)
    u3 = urllib3.HTTPConnectionPool(host, int(port), maxsize=1, timeout=TIMEOUT)
    n = len(batch)

    def smockron_call() -> object:
        return decode_responses(mine.post(PATH, encode_requests(batch), TIMEOUT), n)

    def httpx_call() -> object:
        answer = hx.post(PATH, content=encode_requests(batch))
        answer.raise_for_status()
        return decode_responses(answer.content, n)

    def urllib3_call() -> object:
        answer = u3.urlopen("POST", PATH, body=encode_requests(batch), headers=HEADERS)
        if answer.status != 200:
            raise RuntimeError(f"HTTP {answer.status}")
        return decode_responses(answer.data, n)

    def close() -> None:
        mine.close()
        hx.close()
        u3.close()

    return {"smockron": smockron_call, "httpx": httpx_call, "urllib3": urllib3_call}, close


def measure(call: Case, calls: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per call over ``calls`` calls."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        call()
    return (time.process_time() - cpu) / calls, (time.perf_counter() - wall) / calls


async def ameasure(call: ACase, calls: int) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        await call()
    return (time.process_time() - cpu) / calls, (time.perf_counter() - wall) / calls


async def async_round(
    address: str, batches: dict[str, list[RateLimitRequest]], calls: int
) -> dict[str, tuple[float, float]]:
    """One round of the asyncio cases (transports made inside the round's loop)."""
    mine = AsyncHttpTransport(address)
    hx = httpx.AsyncClient(base_url=f"http://{address}", headers=HEADERS, timeout=TIMEOUT)
    out: dict[str, tuple[float, float]] = {}
    try:
        for size, batch in batches.items():
            n = len(batch)

            async def smockron_call(batch: list[RateLimitRequest] = batch, n: int = n) -> object:
                return decode_responses(await mine.post(PATH, encode_requests(batch), TIMEOUT), n)

            async def httpx_call(batch: list[RateLimitRequest] = batch, n: int = n) -> object:
                answer = await hx.post(PATH, content=encode_requests(batch))
                answer.raise_for_status()
                return decode_responses(answer.content, n)

            count = calls if n == 1 else max(calls // 10, 1)
            for name, call in (("smockron", smockron_call), ("httpx", httpx_call)):
                await call()  # the connection opened outside the measure
                out[f"asyncio, {size}: {name}"] = await ameasure(call, count)
    finally:
        mine.close()
        await hx.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    grpc_port, http_port = free_ports(2)
    address = f"127.0.0.1:{http_port}"
    batches = {"1 check": requests(1), "100 checks": requests(100)}
    results: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        proc = run_smockron(
            ["cluster", "--grpc-address", f"127.0.0.1:{grpc_port}", "--http-address", address],
            Path(tmp) / "node.log",
        )
        try:
            wait_port(grpc_port, 20)
            wait_port(http_port, 20)
            sync = {size: sync_cases(address, batch) for size, batch in batches.items()}
            client = Client(f"127.0.0.1:{grpc_port}", http_address=address)
            try:
                for _ in range(args.rounds):
                    for size, (cases, _close) in sync.items():
                        count = args.calls if size == "1 check" else max(args.calls // 10, 1)
                        for name, call in cases.items():
                            call()  # the connection opened outside the measure
                            found = measure(call, count)
                            results.setdefault(f"sync, {size}: {name}", []).append(found)
                    found = measure(
                        lambda: client.check("bench", "k0", 1, 10**12, MINUTE), args.calls
                    )
                    results.setdefault("sync, 1 check: Client.check (HTTP)", []).append(found)
                    for name, found in asyncio.run(
                        async_round(address, batches, args.calls)
                    ).items():
                        results.setdefault(name, []).append(found)
            finally:
                client.close()
                for _cases, close in sync.values():
                    close()
        finally:
            proc.stop()

    machine = f"{platform.node()}, {platform.machine()}, {os.cpu_count()} CPUs"
    print(
        f"# {time.strftime('%Y-%m-%d')}, {machine}, Python {platform.python_version()}, "
        f"httpx {httpx.__version__}, urllib3 {version('urllib3')}; "
        f"{args.rounds} rounds of {args.calls} calls, medians"
    )
    median: dict[str, tuple[float, float]] = {
        name: (statistics.median(c for c, _w in runs), statistics.median(w for _c, w in runs))
        for name, runs in results.items()
    }
    print(f"{'case':48} {'CPU us/call':>12} {'wall us/call':>13} {'CPU ratio':>10}")
    for name, (cpu, wall) in median.items():
        base = median.get(name.rsplit(": ", 1)[0] + ": smockron")
        ratio = f"{cpu / base[0]:9.2f}x" if base and not name.endswith("smockron") else ""
        print(f"{name:48} {cpu * 1e6:12.1f} {wall * 1e6:13.1f} {ratio:>10}")


if __name__ == "__main__":
    main()
