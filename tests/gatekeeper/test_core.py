"""The threaded and asyncio gatekeepers against real ZeroMQ sockets playing the master."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import pytest

from smockron.errors import ConfigError
from smockron.gatekeeper._asyncio import FLUSH_BATCH, FLUSH_DELAY_S, AsyncGatekeeper
from smockron.gatekeeper._decider import Verdict, wire_identifier
from smockron.gatekeeper._threaded import Gatekeeper
from smockron.wire.codec import ACCEPTED, DELAYED, REJECTED, encode_accounting
from tests.gatekeeper.conftest import MasterSockets, make_master, wall_ms
from tests.support import free_ports, wait_for

D = b"api"


def _connected(gk: Gatekeeper, master: MasterSockets) -> None:
    """Wait until accounting is connected and control subscriptions have propagated."""
    wait_for(lambda: master.accepting() and gk.master_connected, 5)
    until = wall_ms() + 60_000
    probe = b"probe"

    def seen() -> bool:
        master.publish("api", probe, until)
        return gk.decider.table.until(D, probe, wall_ms()) == until

    wait_for(seen, 5, 0.05)
    # and the master's subscription has reached the accounting PUB (sent around the
    # gatekeeper's counters, which the tests check)
    pub = gk._pub
    assert pub is not None
    frames = encode_accounting(D, ACCEPTED, b"probe-accounting", wall_ms())

    def heard() -> bool:
        with gk._lock:
            pub.send_multipart(frames)
        return bool(master.drain(0.05))

    wait_for(heard, 5, 0.05)
    master.drain(0.05)


def test_accepts_and_accounts(master: MasterSockets) -> None:
    with Gatekeeper(master.accounting_addr, master.control_addr, ["api"]) as gk:
        _connected(gk, master)
        now = wall_ms()
        decision = gk.decide(D, b"alice", now, loginfo=b"UA=curl")
        assert decision.verdict is Verdict.ACCEPT
        msg = master.recv()
        assert (msg.domain, msg.status, msg.identifier) == (D, ACCEPTED, b"alice")
        assert msg.received_ms == now and msg.delayed_ms is None and msg.loginfo == b"UA=curl"
        raw = master.drain(0.05)
        assert raw == []
        assert gk.counters.accounting_sent == 1


def test_a_long_identifier_is_accounted_by_its_digest(master: MasterSockets) -> None:
    """Longer than a master accepts (it would drop the message as oversized): decided
    and accounted by its fixed-length digest, counted."""
    token = b"Bearer " + b"t" * 1993
    with Gatekeeper(master.accounting_addr, master.control_addr, ["api"]) as gk:
        _connected(gk, master)
        assert gk.decide(D, token, wall_ms()).verdict is Verdict.ACCEPT
        assert master.recv().identifier == wire_identifier(token)
        assert gk.counters.identifiers_hashed == 1
        until = wall_ms() + 60_000  # the master's verdict for it comes back by the digest
        master.publish("api", wire_identifier(token), until)
        wait_for(lambda: gk.decide(D, token).verdict is Verdict.REJECT, 5)


def test_delay_until_delays_then_rejects(master: MasterSockets) -> None:
    with Gatekeeper(
        master.accounting_addr, master.control_addr, ["api"], max_delay_ms=1000, max_delayed=5
    ) as gk:
        _connected(gk, master)
        now = wall_ms()
        master.publish("api", b"bob", now + 300)
        wait_for(lambda: gk.decider.table.until(D, b"bob", now) == now + 300)
        master.publish("api", b"bob", now + 100)  # never moves backwards
        t0 = time.monotonic()
        decision = gk.admit(D, b"bob")
        assert decision.verdict is Verdict.DELAY and decision.until_ms == now + 300
        assert time.monotonic() - t0 >= 0.2
        assert gk.decider.waiting == 0
        msg = master.recv()
        assert msg.status == DELAYED and msg.delayed_ms == now + 300
        master.publish("api", b"bob", wall_ms() + 5000)  # beyond max_delay
        wait_for(lambda: gk.decide(D, b"carol").verdict is Verdict.ACCEPT)
        wait_for(lambda: gk.decider.table.until(D, b"bob", wall_ms()) > now + 1000)
        rejected = gk.decide(D, b"bob")
        assert rejected.verdict is Verdict.REJECT and rejected.wait_ms > 1000
        statuses = [m.status for m in master.drain(0.2)]
        assert REJECTED in statuses


def test_reject_sampling(master: MasterSockets) -> None:
    with Gatekeeper(
        master.accounting_addr, master.control_addr, ["api"], max_delay_ms=0, reject_sample=0.25
    ) as gk:
        _connected(gk, master)
        master.publish("api", b"eve", wall_ms() + 60_000)
        wait_for(lambda: gk.decider.table.until(D, b"eve", wall_ms()) > 0)
        for _ in range(100):
            assert gk.decide(D, b"eve").verdict is Verdict.REJECT
        got = [m for m in master.drain(0.2) if m.identifier == b"eve"]
        assert len(got) == 25
        assert gk.counters.accounting_sampled_out == 75


def test_malformed_control_is_counted_and_ignored(
    master: MasterSockets, caplog: pytest.LogCaptureFixture
) -> None:
    garbage = [
        [b"api\0"],
        [b"api\0", b"DELAY_UNTIL", b"x"],
        [b"api\0", b"DELAY_UNTIL", b"x", b"-5"],
        [b"api\0", b"DELAY_UNTIL", b"x", b"1e9"],
        [b"api\0", b"DELAY_UNTIL", b"x", b"9" * 40],
        [b"api\0", b"EXPLODE", b"x", b"1"],
        [b"api\0", b"DELAY_UNTIL", b"x" * 5000, b"1"],
        [b"api\0\0", b"DELAY_UNTIL", b"x", b"1"],
        [b"api\0", b"DELAY_UNTIL", b"x", b"1", b"extra"],
        [b"api\0\xff\xfe", b"\x00" * 10],
    ]
    with (
        caplog.at_level(logging.WARNING, "smockron.gatekeeper"),
        Gatekeeper(master.accounting_addr, master.control_addr, ["api"]) as gk,
    ):
        _connected(gk, master)
        for frames in garbage:
            master.publish_raw(frames)
        wait_for(lambda: gk.counters.control_malformed >= len(garbage) - 1)
        # still serving: a valid message after the garbage is applied
        until = wall_ms() + 10_000
        master.publish("api", b"after", until)
        wait_for(lambda: gk.decider.table.until(D, b"after", wall_ms()) == until)
        malformed_lines = [r for r in caplog.records if "malformed" in r.getMessage()]
        assert 1 <= len(malformed_lines) <= 2  # rate-limited


def test_other_domains_are_ignored(master: MasterSockets) -> None:
    with Gatekeeper(master.accounting_addr, master.control_addr, ["api"]) as gk:
        _connected(gk, master)
        master.publish("apiary", b"x", wall_ms() + 10_000)  # prefix-matching topic trap
        master.publish("api", b"y", wall_ms() + 10_000)
        wait_for(lambda: gk.decider.table.until(D, b"y", wall_ms()) > 0)
        assert gk.decider.table.until(b"apiary", b"x", wall_ms()) == 0


@pytest.mark.slow
def test_no_master_everything_passes() -> None:
    a, c = free_ports(2)
    with Gatekeeper(f"tcp://127.0.0.1:{a}", f"tcp://127.0.0.1:{c}", ["api"]) as gk:
        t0 = time.perf_counter()
        for i in range(1000):
            assert gk.decide(D, b"%d" % (i % 7)).verdict is Verdict.ACCEPT
        assert time.perf_counter() - t0 < 1.0
        assert gk.counters.accounting_dropped == 1000
        assert not gk.master_connected
        stats = gk.stats()
        assert stats["accepted"] == 1000 and stats["accounting_sent"] == 0
        assert stats["master_connected"] == 0 and stats["waiting"] == 0


def test_master_dies_and_returns() -> None:
    a, c = free_ports(2)
    m = make_master(a, c)
    gk = Gatekeeper(m.accounting_addr, m.control_addr, ["api"])
    try:
        _connected(gk, m)
        m.close()
        wait_for(lambda: not gk.master_connected, 5)
        assert gk.decide(D, b"z").verdict is Verdict.ACCEPT
        dropped = gk.counters.accounting_dropped
        assert dropped >= 1
        m = make_master(a, c)
        _connected(gk, m)
        gk.decide(D, b"z")
        assert m.recv().identifier == b"z"
    finally:
        gk.close()
        m.close()


def test_subscribe_everything_when_domains_unknown(master: MasterSockets) -> None:
    with Gatekeeper(master.accounting_addr, master.control_addr, None) as gk:
        wait_for(lambda: master.accepting() and gk.master_connected, 5)
        until = wall_ms() + 10_000

        def seen() -> bool:
            master.publish("anything", b"q", until)
            return gk.decider.table.until(b"anything", b"q", wall_ms()) == until

        wait_for(seen, 5, 0.05)


@pytest.mark.slow
async def test_async_twin(master: MasterSockets) -> None:
    async with AsyncGatekeeper(
        master.accounting_addr, master.control_addr, ["api"], max_delay_ms=2000
    ) as gk:
        for _ in range(250):
            if master.accepting() and gk.master_connected:
                break
            await asyncio.sleep(0.02)
        until = wall_ms() + 300
        for _ in range(250):
            master.publish("api", b"amy", until)
            await asyncio.sleep(0.02)
            if gk.decider.table.until(D, b"amy", wall_ms()):
                break
        master.drain(0.01)
        t0 = time.monotonic()
        # many delayed requests wait concurrently on one loop
        decisions = await asyncio.gather(*(gk.admit(D, b"amy") for _ in range(20)))
        elapsed = time.monotonic() - t0
        assert all(d.verdict is Verdict.DELAY for d in decisions)
        assert elapsed < 0.6
        assert gk.decider.waiting == 0
        assert (await gk.admit(D, b"amy")).verdict is Verdict.ACCEPT
        await asyncio.sleep(FLUSH_DELAY_S + 0.02)  # accounting is sent in 2 ms batches
        got = master.drain(0.2)
        assert [m.status for m in got].count(DELAYED) == 20
        assert got[-1].status == ACCEPTED


async def test_async_no_master() -> None:
    a, c = free_ports(2)
    async with AsyncGatekeeper(f"tcp://127.0.0.1:{a}", f"tcp://127.0.0.1:{c}", ["api"]) as gk:
        for i in range(100):
            assert (await gk.admit(D, b"%d" % i)).verdict is Verdict.ACCEPT
        assert gk.counters.accounting_dropped == 100


@pytest.mark.slow
def test_a_stuck_master_never_blocks_requests() -> None:
    """A master that stops reading: the queue fills to SNDHWM, then PUB drops; no blocking."""
    import zmq

    a, c = free_ports(2)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    stuck = ctx.socket(zmq.SUB)
    stuck.setsockopt(zmq.RCVHWM, 10)
    stuck.setsockopt(zmq.RCVBUF, 4096)
    stuck.setsockopt(zmq.SUBSCRIBE, b"")
    stuck.bind(f"tcp://127.0.0.1:{a}")
    try:
        with Gatekeeper(f"tcp://127.0.0.1:{a}", f"tcp://127.0.0.1:{c}", ["api"], sndhwm=10) as gk:
            wait_for(lambda: stuck.getsockopt(zmq.EVENTS) is not None and gk.master_connected, 5)
            t0 = time.perf_counter()
            for i in range(20_000):
                gk.decide(D, b"%d" % i, loginfo=b"x" * 200)
            assert time.perf_counter() - t0 < 5.0
            assert gk.counters.accepted == 20_000
    finally:
        stuck.close(0)
        ctx.term()


async def test_async_accounting_is_batched(master: MasterSockets) -> None:
    async with AsyncGatekeeper(master.accounting_addr, master.control_addr, ["api"]) as gk:
        for _ in range(250):
            if master.accepting() and gk.master_connected:
                break
            await asyncio.sleep(0.02)
        for _ in range(100):  # until the master's subscription is in place
            gk.decide(D, b"probe")
            await asyncio.sleep(0)
            if master.drain(0.02):
                break
        gk.counters.accounting_sent = 0
        for i in range(50):  # decided within the flush delay: queued, not yet sent
            gk.decide(D, b"b%d" % i)
        assert gk.counters.accounting_sent == 0
        await asyncio.sleep(FLUSH_DELAY_S + 0.02)
        assert gk.counters.accounting_sent == 50
        got = master.drain(0.2)
        assert [m.identifier for m in got] == [b"b%d" % i for i in range(50)]
        for i in range(FLUSH_BATCH):  # a full batch goes at once, without the timer
            gk.decide(D, b"f%d" % i)
        assert gk.counters.accounting_sent == 50 + FLUSH_BATCH
        assert len(master.drain(0.2)) == FLUSH_BATCH
        # the timer the full batch's first message armed is still due: it sends this one
        gk.decide(D, b"late")
        await asyncio.sleep(FLUSH_DELAY_S + 0.02)
        assert gk.counters.accounting_sent == 50 + FLUSH_BATCH + 1
        assert [m.identifier for m in master.drain(0.2)] == [b"late"]
        gk.decide(D, b"last")
    # closing flushes what is still queued
    assert master.recv().identifier == b"last"


@pytest.mark.parametrize(("sample", "sent_or_dropped"), [(0.0, 0), (1.0, 10)])
def test_reject_sample_bounds_without_a_master(sample: float, sent_or_dropped: int) -> None:
    gk = AsyncGatekeeper(None, None, ["api"], max_delay_ms=0, reject_sample=sample)
    gk.decider.table.update(D, b"eve", wall_ms() + 60_000, wall_ms())
    for _ in range(10):
        assert gk.decide(D, b"eve").verdict is Verdict.REJECT
    assert gk.counters.accounting_dropped == sent_or_dropped  # no master: dropped, counted
    assert gk.counters.accounting_sampled_out == 10 - sent_or_dropped


@pytest.mark.parametrize("sample", [-0.1, 1.01, float("nan")])
def test_reject_sample_out_of_range_is_refused(sample: float) -> None:
    with pytest.raises(ConfigError):
        AsyncGatekeeper(None, None, ["api"], reject_sample=sample)


def _batch_io_threads() -> int:
    """ZeroMQ I/O threads of this process running under SCHED_BATCH."""
    count = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            policy = os.sched_getscheduler(int(task.name))
        except OSError:  # the thread ended meanwhile
            continue
        if name.startswith("ZMQbg/IO") and policy == os.SCHED_BATCH:
            count += 1
    return count


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policy")
async def test_io_threads_run_under_sched_batch(master: MasterSockets) -> None:
    """Both twins put their ZeroMQ I/O thread under SCHED_BATCH (no preemption per send)."""
    before = _batch_io_threads()

    async def batch_threads(expected: int) -> int:
        # a new I/O thread applies its policy itself once it runs: give it a moment
        for _ in range(100):
            if (count := _batch_io_threads()) >= expected:
                return count
            await asyncio.sleep(0.02)
        return _batch_io_threads()

    with Gatekeeper(master.accounting_addr, master.control_addr, ["api"]):
        assert await batch_threads(before + 1) == before + 1
        async with AsyncGatekeeper(master.accounting_addr, master.control_addr, ["api"]):
            assert await batch_threads(before + 2) == before + 2


def test_a_far_future_delay_until_is_refused_and_logged(
    master: MasterSockets, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever holds the control port cannot block a client until the year 9999: the
    real master could never lift it (the table only moves forward)."""
    with Gatekeeper(
        master.accounting_addr, master.control_addr, ["api"], max_ahead_ms=3_600_000
    ) as gk:
        _connected(gk, master)
        master.publish("api", b"victim", 253_402_300_799_000)
        wait_for(lambda: gk.stats()["control_refused"] == 1, 5)
        assert gk.decide(D, b"victim").verdict.value == "accept"
        master.publish("api", b"victim", wall_ms() + 3_000_000)  # within the cap: taken
        wait_for(lambda: gk.decider.table.until(D, b"victim", wall_ms()) > 0, 5)
    assert any("refusing DELAY_UNTIL 253402300799000" in r.message for r in caplog.records)


def test_control_connection_state_is_tracked_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A gatekeeper whose control connection is down hears no verdicts: it says so."""
    a, c = free_ports(2)
    caplog.set_level(logging.INFO, "smockron.gatekeeper")
    master = make_master(a, c)
    with Gatekeeper(master.accounting_addr, master.control_addr, ["api"]) as gk:
        try:
            wait_for(lambda: gk.stats()["control_connected"] == 1, 5)
        finally:
            master.close()
        wait_for(lambda: not gk.control_connected, 5)
    messages = [r.message for r in caplog.records]
    assert any(m.startswith("control connected to tcp://127.0.0.1:") for m in messages)
    assert any("control disconnected from" in m for m in messages)


async def test_async_twin_tracks_the_control_connection(master: MasterSockets) -> None:
    async with AsyncGatekeeper(master.accounting_addr, master.control_addr, ["api"]) as gk:
        for _ in range(250):
            if gk.control_connected:
                break
            await asyncio.sleep(0.02)
        assert gk.stats()["control_connected"] == 1


@pytest.mark.parametrize("first_counted_before", [False, True])
def test_two_masters_subscriptions_read_at_once_count_both(first_counted_before: bool) -> None:
    """Both masters' subscriptions read in one go while one or neither connection's
    handshake event has come (as a fleet's gatekeeper on a busy machine sees them):
    both connections count, so the first master's death leaves the second holding the
    share, not a fail-open. (The first connection used the early subscription up, or a
    read that found one waiting kept none for the next; the second never counted.)"""
    a, b, c, d = free_ports(4)
    first = (f"tcp://127.0.0.1:{a}", f"tcp://127.0.0.1:{b}")
    second = (f"tcp://127.0.0.1:{c}", f"tcp://127.0.0.1:{d}")
    gk = AsyncGatekeeper(None, None, ["api"], masters=[first, second])
    if first_counted_before:
        gk._connection_up(False, 0)
    gk._apply_subscriptions()  # the XPUB's messages say no master: two arrived
    if not first_counted_before:
        gk._connection_up(False, 0)
    gk._connection_up(False, 1)
    assert gk._peers == 2
    gk._connection_down(False, 0)
    assert gk.master_connected
