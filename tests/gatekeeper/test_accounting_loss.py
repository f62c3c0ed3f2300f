"""Accounting a gatekeeper sends is processed by the master or counted where it is lost:
a tight asyncio loop against a real master process, deciding from before the connection
is up until the gatekeeper is closed, leaves no message unaccounted for. (Before, what
was sent between the handshake and the master's subscription, and what was still queued
at close, vanished: counted as sent, never received.)"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from smockron.gatekeeper import AsyncGatekeeper, Gatekeeper
from tests.support import free_ports, master_args, run_smockron, stopping, wait_for, wait_port

N = 60_000
RUNS = 3


def _master_counts(port: int) -> dict[str, float]:
    """Accounting messages the master processed, dropped (its full queue) or judged late."""
    out = {"processed": 0.0, "dropped": 0.0, "late": 0.0}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            name, _, value = line.rpartition(" ")
            if name.startswith("smockron_master_messages_total{"):
                out["processed"] += float(value)
            elif name == "smockron_master_dropped_all_total":
                out["dropped"] += float(value)
            elif name.startswith("smockron_master_late_total"):
                out["late"] += float(value)
    return out


def _settled(port: int, expected: float) -> dict[str, float]:
    """The master's counts once they reach ``expected`` or stop moving."""
    last: dict[str, float] = {}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        counts = _master_counts(port)
        if sum(counts.values()) >= expected or counts == last:
            return counts
        last = counts
        time.sleep(0.5)
    return last


@pytest.fixture
def master(tmp_path: Path) -> Iterator[tuple[tuple[str, str], int]]:
    acc, ctl, met = free_ports(3)
    zmq = (f"tcp://127.0.0.1:{acc}", f"tcp://127.0.0.1:{ctl}")
    args = master_args(acc, ctl, rules=["api:1000000/s:1000000"], metrics=met)
    proc = run_smockron(args, tmp_path / "master.log")
    with stopping([proc]):
        wait_port(met)
        yield zmq, met


async def _tight(accounting: str, control: str) -> dict[str, int]:
    gk = AsyncGatekeeper(accounting, control, ["api"])
    gk.start()  # decides from the start: before the connection, then at full speed
    i = 0
    deadline = time.monotonic() + 30
    # N decisions, and on a loaded machine as many more as it takes to decide some with
    # the connection up (2,000 after it), within 30 s
    while i < N or (not gk.master_connected and time.monotonic() < deadline):
        gk.decide(b"api", b"client%d" % (i % 997))
        i += 1
        if i % 2000 == 0:
            await asyncio.sleep(0)
    for j in range(2000 if i > N else 0):
        gk.decide(b"api", b"client%d" % (j % 997))
        i += 1
    stats = gk.stats()
    stats["decided"] = i
    await gk.aclose()  # at once: what is queued still reaches the master
    stats["accounting_sent"] = gk.counters.accounting_sent  # aclose flushed the batch
    stats["accounting_dropped"] = gk.counters.accounting_dropped
    return stats


def _check(stats: dict[str, int], counts: dict[str, float], sent: int) -> None:
    """This gatekeeper counted each decision sent or dropped; the master counted each
    message sent (by every gatekeeper so far) processed, dropped or late."""
    assert stats["accounting_sent"] + stats["accounting_dropped"] == stats.get("decided", N)
    assert stats["accounting_sent"] > 0
    received = counts["processed"] + counts["dropped"] + counts["late"]
    assert received == sent, (stats, counts)


def test_a_tight_asyncio_loop_loses_nothing_uncounted(master: tuple[tuple[str, str], int]) -> None:
    (acc, ctl), met = master
    sent = 0
    for _ in range(RUNS):  # each a new connection: its start and its close
        stats = asyncio.run(_tight(acc, ctl))
        sent += stats["accounting_sent"]
        counts = _settled(met, sent)
        _check(stats, counts, sent)


def test_a_tight_threaded_loop_loses_nothing_uncounted(
    master: tuple[tuple[str, str], int],
) -> None:
    (acc, ctl), met = master
    gk = Gatekeeper(acc, ctl, ["api"])
    try:
        wait_for(lambda: gk.master_connected, 10, 0.001)
        for i in range(N):
            gk.decide(b"api", b"client%d" % (i % 997))
    finally:
        gk.close()
    stats = gk.stats()
    _check(stats, _settled(met, stats["accounting_sent"]), stats["accounting_sent"])
