"""A message of too many frames is counted and logged with its real length, by a real
master (accounting) and by real gatekeepers (control), over real sockets on 127.0.0.1;
the messages around it are served."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import pytest
import zmq

from smockron.gatekeeper._asyncio import AsyncGatekeeper
from smockron.gatekeeper._threaded import Gatekeeper
from smockron.wire.codec import ACCEPTED, DELAY_UNTIL, MAX_FRAMES, encode_accounting
from tests.gatekeeper.conftest import MasterSockets, master_sockets, wall_ms
from tests.master.running import running_master, settings
from tests.support import wait_for

LENGTHS = (40, MAX_FRAMES + 132)
"""Within what a reader keeps, and far past it (only counted)."""


def test_master_logs_the_real_frame_count(caplog: pytest.LogCaptureFixture) -> None:
    config = settings(api="1/60s:1")
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    push = ctx.socket(zmq.PUB)
    push.setsockopt(zmq.LINGER, 0)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.subscribe(b"api\0")
    try:
        with caplog.at_level(logging.WARNING, "smockron.master"), running_master(config) as master:
            push.connect(config.accounting)
            sub.connect(config.control)
            deadline = time.monotonic() + 10
            while not sub.poll(50):  # both ways up: a probe comes back as a DELAY_UNTIL
                assert time.monotonic() < deadline, "the master never answered"
                push.send_multipart(encode_accounting("api", ACCEPTED, b"probe", wall_ms()))
            before = master.stats.domains["api"].accepted
            now = wall_ms()
            push.send_multipart(encode_accounting("api", ACCEPTED, b"before", now))
            for n in LENGTHS:
                push.send_multipart([b"api\0", ACCEPTED, *(b"f%d" % i for i in range(n - 2))])
            push.send_multipart(encode_accounting("api", ACCEPTED, b"after", now))
            wait_for(lambda: master.stats.malformed["frame_count"] == len(LENGTHS), 10)
            wait_for(lambda: master.stats.domains["api"].accepted - before >= 2, 10)
            verdicts: set[bytes] = set()
            while not {b"before", b"after"} <= verdicts and sub.poll(2000):
                frames = sub.recv_multipart()
                if frames[1] == DELAY_UNTIL:
                    verdicts.add(frames[2])
            assert {b"before", b"after"} <= verdicts
            assert master.stats.domains["api"].malformed == len(LENGTHS)
    finally:
        push.close(0)
        sub.close(0)
        ctx.term()
    lines = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    for n in LENGTHS:
        assert any(f"has {n} frames" in line for line in lines), (n, lines)


@pytest.fixture
def master() -> Iterator[MasterSockets]:
    with master_sockets() as m:
        yield m


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("threaded", [False, True], ids=["asyncio", "threaded"])
async def test_gatekeeper_logs_the_real_frame_count(
    master: MasterSockets, caplog: pytest.LogCaptureFixture, threaded: bool, length: int
) -> None:
    """Through the control reader's compiled (or Python) batch decode; one malformed
    message per gatekeeper, as its log is rate-limited to one line per interval."""
    kind = Gatekeeper if threaded else AsyncGatekeeper
    gk = kind(master.accounting_addr, master.control_addr, ["api"])
    try:
        if isinstance(gk, AsyncGatekeeper):
            gk.start()
        with caplog.at_level(logging.WARNING, "smockron.gatekeeper"):
            deadline = time.monotonic() + 10
            while gk.decider.table.until(b"api", b"probe", wall_ms()) == 0:
                assert time.monotonic() < deadline, "control never connected"
                master.publish("api", b"probe", wall_ms() + 60_000)
                await asyncio.sleep(0.05)
            far = wall_ms() + 60_000
            master.publish("api", b"before", far)
            master.publish_raw([b"api\0", DELAY_UNTIL, *(b"%d" % i for i in range(length - 2))])
            master.publish("api", b"after", far)
            deadline = time.monotonic() + 10
            while gk.decider.table.until(b"api", b"after", wall_ms()) == 0:
                assert time.monotonic() < deadline, "the DELAY_UNTIL after them never came"
                await asyncio.sleep(0.02)
        assert gk.decider.table.until(b"api", b"before", wall_ms()) == far
        assert gk.counters.control_malformed == 1
    finally:
        if isinstance(gk, AsyncGatekeeper):
            await gk.aclose()
        else:
            gk.close()
    lines = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert any(f"DELAY_UNTIL has {length} frames" in line for line in lines), lines
