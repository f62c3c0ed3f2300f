"""A real Master serving on 127.0.0.1 from a thread of its own (its own asyncio loop),
so a test can block its own thread or loop while the master goes on."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import zmq

from smockron.core.rules import Rule
from smockron.master.config import MasterSettings
from smockron.master.domains import DomainPolicy
from smockron.master.server import Master
from tests.support import free_ports


def settings(store: str = "memory://", *, hwm: int = 100_000, **rules: str) -> MasterSettings:
    """Settings on free loopback ports; ``rules`` as ``api="1/60s:1"`` (``gcra:`` prefix
    for GCRA)."""
    acc, ctl = free_ports(2)
    domains = {}
    for name, spec in rules.items():
        algorithm, _, text = spec.rpartition(":") if spec.startswith("gcra:") else ("", "", spec)
        rate, _, burst = text.partition(":")
        count, _, per = rate.partition("/")
        seconds = {"s": 1.0, "60s": 60.0, "m": 60.0, "h": 3600.0}[per]
        domains[name] = DomainPolicy(
            (Rule(float(count) / seconds, int(burst)),), algorithm or "history"
        )
    return MasterSettings(
        accounting=f"tcp://127.0.0.1:{acc}",
        control=f"tcp://127.0.0.1:{ctl}",
        store=store,
        hwm=hwm,
        stats_interval=0,
        domains=domains,
    )


@contextmanager
def running_master(config: MasterSettings) -> Iterator[Master]:
    """Serve ``config`` until the block ends; the master is bound when this yields."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    master = Master(config, context=ctx)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(master.run(handle_signals=False)), daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 10
    while not master.bound and time.monotonic() < deadline:
        time.sleep(0.01)
    assert master.bound, "the master did not bind within 10 s"
    try:
        yield master
    finally:
        loop.call_soon_threadsafe(master.stop)
        thread.join(10)
        loop.close()
        ctx.term()
