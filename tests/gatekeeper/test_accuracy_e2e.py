"""Abusive patterns through real processes: a master, proxies and a backend that counts.

Small scale (a few seconds each); bench/accuracy.py runs the full matrix. Bounds have a
little slack for a loaded 2-core CI machine; the simulated-network tests in tests/sim
hold the exact ones.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import aiohttp
import pytest

from tests import support
from tests.gatekeeper.backend import Seen, backend
from tests.gatekeeper.commands import proxy_args
from tests.support import Proc, free_ports, run_smockron, stopping, wait_for, wait_port

RULE = "api:10/s:10"
RATE, BURST = 10.0, 10


def master_args(acc: int, ctl: int, *extra: str) -> list[str]:
    return support.master_args(acc, ctl, "--stats-interval", "0.5", *extra, rules=[RULE])


def heard_rules(proc: Proc) -> bool:
    return "first line for 'api'" in proc.log()


@contextmanager
def system(
    tmp_path: Path, proxies: int, *proxy_extra: str, master: bool = True
) -> Iterator[tuple[list[int], Seen, list[Proc]]]:
    acc, ctl, *ports = free_ports(2 + proxies)
    with backend() as (up, seen):
        procs: list[Proc] = []
        with stopping(procs):
            if master:
                procs.append(run_smockron(master_args(acc, ctl), tmp_path / "master.log"))
            zmq = (f"tcp://127.0.0.1:{acc}", f"tcp://127.0.0.1:{ctl}")
            for p in ports:
                args = proxy_args(
                    p, up, *zmq, "--decision-header", *proxy_extra, domain="api", max_delay="5s"
                )
                procs.append(run_smockron(args, tmp_path / f"proxy-{p}.log"))
            for p in ports:
                wait_port(p)
            if master:  # each proxy has heard the master's rules
                for proc in procs[1:]:
                    wait_for(partial(heard_rules, proc), 15)
            yield ports, seen, procs


async def _get(session: aiohttp.ClientSession, port: int, who: str) -> str:
    async with session.get(f"http://127.0.0.1:{port}/", headers={"X-Client": who}) as r:
        await r.read()
        return r.headers.get("X-Smockron-Decision", str(r.status))


async def _timed_burst(ports: list[int], who: str, n: int) -> tuple[Counter[str], float]:
    """The decisions, and how long the burst took to reach the proxy.

    The pool's connections are opened first (by other clients, each within its rule), so
    the burst is one: opening 200 connections on a loaded machine spreads it out. Every
    request arriving after the proxy's delays are full is rejected until one interval
    passes, and then delayed: so what bounds the delays is when the last request was
    sent (or, later still, when the last rejection came back), not the rejections alone.
    """
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=30)
    sent_by = rejected_by = 0.0
    start = 0.0

    async def headers_sent(*_: object) -> None:
        nonlocal sent_by
        sent_by = max(sent_by, time.monotonic() - start)

    trace = aiohttp.TraceConfig()
    trace.on_request_headers_sent.append(headers_sent)

    async def one(session: aiohttp.ClientSession, port: int) -> str:
        nonlocal rejected_by
        got = await _get(session, port, who)
        if got == "reject":
            rejected_by = max(rejected_by, time.monotonic() - start)
        return got

    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, trace_configs=[trace]
    ) as session:
        warm = (_get(session, ports[i % len(ports)], f"warm-{i}") for i in range(n))
        assert set(await asyncio.gather(*warm)) == {"accept"}
        start, sent_by = time.monotonic(), 0.0
        got = await asyncio.gather(*(one(session, ports[i % len(ports)]) for i in range(n)))
    return Counter(got), max(sent_by, rejected_by)


async def _burst(ports: list[int], who: str, n: int) -> Counter[str]:
    return (await _timed_burst(ports, who, n))[0]


def _arrivals(seen: Seen, who: str, since: float = 0.0) -> list[float]:
    with seen.lock:
        return sorted(t for t, c in seen.arrivals if c == who and t >= since)


def _at_once(arrivals: list[float]) -> int:
    return sum(1 for t in arrivals if t - arrivals[0] <= 0.1) if arrivals else 0


def _offsets(arrivals: list[float]) -> list[float]:
    """The first arrivals, in milliseconds after the first (what a failure shows)."""
    return [round((t - arrivals[0]) * 1000, 1) for t in arrivals[:15]]


def test_one_burst_of_200_through_one_proxy_admits_the_burst(tmp_path: Path) -> None:
    with system(tmp_path, 1) as (ports, seen, _procs):
        decisions, spread = asyncio.run(_timed_burst(ports, "abuser", 200))
        arrivals = _arrivals(seen, "abuser")
    assert sum(decisions.values()) == 200
    # the burst passes at once (one more if the burst takes over an interval to arrive);
    # what arrives together at the backend is no more than that
    assert BURST <= decisions["accept"] <= BURST + 2, decisions
    assert _at_once(arrivals) <= BURST + 1, (decisions, _offsets(arrivals))
    # the rest waits its turn, one per interval, within the 5 s longest delay counted from
    # each request's arrival (a loaded machine spreads the burst's arrivals out)
    waits = RATE * (5 + spread)
    assert decisions["reject"] >= 200 - BURST - waits - 2, (decisions, spread)
    assert len(arrivals) <= BURST + waits + 2
    # and what reached the backend kept to the rule throughout
    assert len(arrivals) <= BURST + RATE * (arrivals[-1] - arrivals[0]) + 2


def test_the_first_line_holds_before_the_master_is_heard_from(tmp_path: Path) -> None:
    """No master at all: the proxy's own --rule holds a burst to it (and it serves)."""
    with system(tmp_path, 1, "--rule", RULE, master=False) as (ports, seen, _procs):
        decisions = asyncio.run(_burst(ports, "abuser", 100))
        assert _at_once(_arrivals(seen, "abuser")) <= BURST + 1
        assert BURST <= decisions["accept"] <= BURST + 2 and sum(decisions.values()) == 100
        assert asyncio.run(_burst(ports, "someone-else", 5)) == Counter({"accept": 5})


@pytest.mark.slow  # timing: the polite client's even spacing is the test's own clock
@pytest.mark.parametrize("proxies", [2, 4])
def test_bursts_over_several_proxies_are_held_to_the_rule(tmp_path: Path, proxies: int) -> None:
    """Bursts of 10 concurrent requests every 250 ms for 4 s, round-robin over the
    proxies, beside a polite client at 0.9x its rule that must never be slowed."""
    duration = 4.0

    async def traffic(ports: list[int]) -> tuple[Counter[str], float]:
        polite: Counter[str] = Counter()
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            start = time.monotonic()
            tasks: list[asyncio.Task[str]] = []
            polite_tasks: list[asyncio.Task[str]] = []

            async def abusive() -> None:
                k = 0
                for b in range(int(duration / 0.25)):
                    await asyncio.sleep(max(0.0, start + b * 0.25 - time.monotonic()))
                    for _ in range(10):
                        port = ports[k % len(ports)]
                        tasks.append(asyncio.create_task(_get(session, port, "abuser")))
                        k += 1

            async def polite_client() -> None:  # evenly spaced, at 0.9x the rule
                for i in range(int(duration * 0.9 * RATE)):
                    at = start + i / (0.9 * RATE)
                    await asyncio.sleep(max(0.0, at - time.monotonic()))
                    port = ports[i % len(ports)]
                    polite_tasks.append(asyncio.create_task(_get(session, port, "polite")))

            await asyncio.gather(abusive(), polite_client())
            await asyncio.gather(*tasks)
            polite.update(await asyncio.gather(*polite_tasks))
        return polite, start

    with system(tmp_path, proxies) as (ports, seen, _procs):
        polite, start = asyncio.run(traffic(ports))
        inside = [t for t in _arrivals(seen, "abuser") if t <= start + duration]
    ideal = BURST + RATE * duration
    assert 0.8 * ideal <= len(inside) <= 1.1 * ideal + 1, (len(inside), ideal)
    assert set(polite) == {"accept"}, polite


def test_a_polite_client_is_never_delayed_across_a_master_restart(tmp_path: Path) -> None:
    acc, ctl, port = free_ports(3)
    with backend() as (up, seen):
        procs: list[Proc] = []
        with stopping(procs):
            master = run_smockron(master_args(acc, ctl), tmp_path / "m1.log")
            zmq = (f"tcp://127.0.0.1:{acc}", f"tcp://127.0.0.1:{ctl}")
            proxy = run_smockron(
                proxy_args(port, up, *zmq, "--decision-header", domain="api", max_delay="5s"),
                tmp_path / "proxy.log",
            )
            procs += [master, proxy]
            wait_port(port)

            async def polite(seconds: float, on_the_way: float | None = None) -> Counter[str]:
                got: Counter[str] = Counter()
                async with aiohttp.ClientSession() as session:
                    start = time.monotonic()
                    i = 0
                    while time.monotonic() - start < seconds:
                        await asyncio.sleep(max(0.0, start + i / (0.9 * RATE) - time.monotonic()))
                        got[await _get(session, port, "polite")] += 1
                        if on_the_way is not None and time.monotonic() - start >= on_the_way:
                            on_the_way = None
                            master.kill()
                        i += 1
                return got

            first = asyncio.run(polite(3.0, on_the_way=1.5))  # the master dies half-way
            master = run_smockron(master_args(acc, ctl), tmp_path / "m2.log")
            procs.append(master)
            again = asyncio.run(polite(3.0))
    assert set(first) == {"accept"}, first
    assert set(again) == {"accept"}, again
    assert len(_arrivals(seen, "polite")) == sum(first.values()) + sum(again.values())
