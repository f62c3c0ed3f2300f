"""A resync goes as fast as its slowest subscriber takes it and loses nothing, live
messages sent in between included; a subscriber that takes nothing stops holding it up.
Real PUB and SUB sockets on 127.0.0.1, with small queues."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Iterator

import pytest
import zmq

from smockron.master import control_out
from smockron.master.control_out import ControlOut
from smockron.wire.codec import control_frames
from smockron.wire.control import send_controls
from tests.support import wait_for

HWM = 50


@pytest.fixture
def sockets() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    """(pub, sub): small queues on both sides, as a busy gatekeeper's fill up."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub, sub = ctx.socket(zmq.PUB), ctx.socket(zmq.SUB)
    pub.setsockopt(zmq.SNDHWM, HWM)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub.setsockopt(zmq.RCVHWM, HWM)
    sub.setsockopt(zmq.RCVBUF, 4096)
    sub.subscribe(b"api\0")
    sub.connect(f"tcp://127.0.0.1:{port}")
    wait_for(lambda: pub.send_multipart([b"api\0", b"HELLO"]) is None and sub.poll(10) != 0)
    while sub.poll(50):
        sub.recv_multipart()
    try:
        yield pub, sub
    finally:
        pub.close(0)
        sub.close(0)
        ctx.term()


def _slices(pub: zmq.Socket[bytes], verdicts: list[tuple[bytes, int]], rest: int) -> int:
    return send_controls(pub, b"api\0", verdicts[rest:], True)


async def test_a_paced_resync_loses_nothing_with_live_traffic_in_between(
    sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """20,000 DELAY_UNTILs through queues of 50 to a reader slower than the sender, and
    live messages all along (another task, as the master's live verdicts): the reader gets
    every one, in order within each stream. (libzmq, having dropped a live message for a
    full subscriber, would drop the resync's next ones for it too, without a refusal.)"""
    monkeypatch.setattr(control_out, "LIVE_WAIT_MAX_S", 30.0)  # a loaded machine's pauses
    pub, sub = sockets
    out = ControlOut(pub)
    got: list[list[bytes]] = []
    stop = threading.Event()

    def read() -> None:  # slow: a pause every 1,000 messages
        while not stop.is_set():
            if sub.poll(20):
                got.append(sub.recv_multipart())
                if len(got) % 1000 == 0:
                    time.sleep(0.02)

    async def live_traffic() -> None:
        for k in range(len(live)):
            out.send([live[k]])
            await asyncio.sleep(0.002)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        verdicts = [(b"id-%d" % i, 1_700_000_000_000 + i) for i in range(20_000)]
        live = [[b"api\0", b"DELAY_UNTIL", b"live-%d" % k, b"1"] for k in range(200)]
        out.begin()
        sent = 0
        traffic = asyncio.create_task(live_traffic())
        for start in range(0, len(verdicts), 500):
            part = verdicts[start : start + 500]
            sent += await out.paced(functools.partial(_slices, pub, part), len(part))
            await asyncio.sleep(0)
        await traffic
        await out.paced(lambda rest: 0, 0)
        out.end()
        assert sent == len(verdicts) and not out.stalled
        wait_for(lambda: len(got) >= len(verdicts) + len(live), 10)
    finally:
        stop.set()
        reader.join()
    assert [m for m in got if m[2].startswith(b"id-")] == [
        control_frames(b"api\0", i, u) for i, u in verdicts
    ]
    assert [m for m in got if m[2].startswith(b"live-")] == live


async def test_a_subscriber_that_takes_nothing_stops_holding_a_resync_up(
    sockets: tuple[zmq.Socket[bytes], zmq.Socket[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control_out, "RESYNC_STALL_S", 0.2)
    pub, _sub = sockets  # never read
    out = ControlOut(pub)
    verdicts = [(b"id-%d" % i, 1_700_000_000_000 + i) for i in range(100_000)]
    out.begin()
    sent = await asyncio.wait_for(  # the kernel's buffers take some first: not at once
        out.paced(functools.partial(_slices, pub, verdicts), len(verdicts)), 10
    )
    out.end()
    assert out.stalled
    assert sent == len(verdicts)  # the rest went as live traffic does: dropped for it
    out.send([[b"api\0", b"DELAY_UNTIL", b"x", b"1"]])  # and the socket drops again


@pytest.mark.slow
async def test_a_slow_subscriber_holds_live_messages_up_no_longer_than_the_bound() -> None:
    """A gatekeeper that takes a message every 5 ms keeps making progress, so it is never
    'stalled'; but live verdicts (what enforcement runs on) must not queue behind its
    resync for long: 1,000 of them refused would wait 5 s for it, and after
    LIVE_WAIT_MAX_S the resync turns lossy and they go."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub, sub = ctx.socket(zmq.PUB), ctx.socket(zmq.SUB)
    for sock in (pub, sub):  # small queues and kernel buffers: the reader's pace is felt
        sock.setsockopt(zmq.SNDHWM, HWM)
        sock.setsockopt(zmq.RCVHWM, HWM)
        sock.setsockopt(zmq.SNDBUF, 4096)
        sock.setsockopt(zmq.RCVBUF, 4096)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub.subscribe(b"api\0")
    sub.connect(f"tcp://127.0.0.1:{port}")
    wait_for(lambda: pub.send_multipart([b"api\0", b"HELLO"]) is None and sub.poll(10) != 0)
    out = ControlOut(pub)
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            if sub.poll(20):
                sub.recv_multipart()
                time.sleep(0.005)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        verdicts = [(b"id-%d" % i, 1_700_000_000_000 + i) for i in range(100_000)]
        out.begin()
        resync = asyncio.create_task(
            out.paced(functools.partial(_slices, pub, verdicts), len(verdicts))
        )
        await asyncio.sleep(0.3)  # the resync has filled the queues
        sent_at = time.monotonic()
        out.send([[b"api\0", b"DELAY_UNTIL", b"live-%d" % k, b"1"] for k in range(1000)])
        assert len(out.deferred) > 500  # refused (the subscriber is full): they wait
        while out.deferred and time.monotonic() - sent_at < 10:
            await asyncio.sleep(0.005)
        waited = time.monotonic() - sent_at
        await asyncio.wait_for(resync, 10)
        out.end()
    finally:
        stop.set()
        reader.join()
        pub.close(0)
        sub.close(0)
        ctx.term()
    assert out.stalled.startswith("live messages waited"), out.stalled
    assert control_out.LIVE_WAIT_MAX_S <= waited < control_out.LIVE_WAIT_MAX_S + 1.0
