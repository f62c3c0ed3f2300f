"""Both control twins (compiled and pure Python) decode and encode DELAY_UNTILs the same
way, over real sockets on 127.0.0.1."""

from __future__ import annotations

from typing import Any

import pytest
import zmq

from smockron.core.rules import Rule
from smockron.wire.codec import (
    DEFAULT_LIMITS,
    MAX_FRAMES,
    RULES_TOPIC,
    Oversized,
    control_frames,
    decode_control,
    encode_rules,
    frame_count,
)
from smockron.wire.control import (
    COMPILED,
    DrainControl,
    SendControls,
    drain_control_compiled,
    drain_control_python,
    send_controls_compiled,
    send_controls_python,
    split_control,
)
from tests.support import twins, wait_for

DRAINS = twins(drain_control_python, drain_control_compiled if COMPILED else None, "_zmqfast")
SENDS = twins(send_controls_python, send_controls_compiled if COMPILED else None, "_zmqfast")
TOPICS = {b"api\0": b"api", b"web\0": b"web"}


MESSAGES: list[list[bytes]] = [
    [b"api\0", b"DELAY_UNTIL", b"a", b"1700000000000"],
    [b"api\0", b"RESYNCSTART"],
    [b"web\0", b"DELAY_UNTIL", b"\0\xff", b"1"],
    [b"other\0", b"DELAY_UNTIL", b"a", b"1"],  # not ours: raw
    [b"api\0", b"DELAY_UNTIL", b"a" * 1025, b"1"],
    [b"api\0", b"DELAY_UNTIL", b"a", b"99999999999999999"],
    [b"api\0", b"DELAY_UNTIL", b"a", b"9999999999999999"],
    [b"api\0", b"DELAY_UNTIL", b"a", b"+1"],
    [b"api\0", b"DELAY_UNTIL", b"a", b""],
    [b"api\0", b"DELAY_UNTIL", b"a", b"1", b"extra"],
    [b"api\0", b"DELAY_UNTILX", b"a", b"1"],
    [b"api", b"DELAY_UNTIL", b"a", b"1"],
    encode_rules("api", "history", tuple(Rule(1.0 + i, 1) for i in range(64))),
    [b"api\0", b"DELAY_UNTIL", *(b"%d" % i for i in range(MAX_FRAMES + 60))],
    [b"api\0", b"RESYNCDONE"],
    [b"api\0", b"DELAY_UNTIL", b"b", b"0001700000000000"],
]


@pytest.mark.parametrize("drain", DRAINS)
def test_both_twins_split_in_order_as_the_contract_says(
    drain: DrainControl[bytes], pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]
) -> None:
    push, pull = pair
    for m in MESSAGES:
        push.send_multipart(m)
    got: list[Any] = []

    def received_all() -> bool:
        batch = drain(pull, 5, TOPICS, DEFAULT_LIMITS)
        assert len(batch) <= 5
        got.extend(batch)
        return len(got) == len(MESSAGES)

    wait_for(received_all)
    records = [g for g in got if type(g) is tuple]
    assert records == [
        (b"api", b"a", 1_700_000_000_000),
        (b"web", b"\0\xff", 1),
        (b"api", b"b", 1_700_000_000_000),
    ]
    expected = split_control(MESSAGES, TOPICS, DEFAULT_LIMITS)
    assert [type(g) is tuple for g in got] == [type(e) is tuple for e in expected]
    assert [g if type(g) is tuple else list(g) for g in got] == [
        e if type(e) is tuple else list(e)[:MAX_FRAMES] for e in expected
    ]
    assert [frame_count(g) for g in got if type(g) is not tuple] == [
        len(e) for e in expected if type(e) is not tuple
    ]
    oversized = [g for g in got if isinstance(g, Oversized)]
    assert len(oversized) == 1 and oversized[0].total == MAX_FRAMES + 62
    rules = [g for g in got if type(g) is not tuple and g[0] == RULES_TOPIC]
    assert len(rules) == 1 and len(rules[0]) == MAX_FRAMES  # a full offer, kept whole
    for g, frames in zip(got, MESSAGES, strict=True):
        if type(g) is tuple:  # what the codec makes of the same message
            control = decode_control(frames)
            assert g == (TOPICS[frames[0]], control.identifier, control.until_ms)


@pytest.mark.parametrize("send", SENDS)
def test_both_twins_send_the_codecs_frames(
    send: SendControls, pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]
) -> None:
    push, pull = pair
    pairs = [(b"id%d" % i, 1_700_000_000_000 + i) for i in range(1000)] + [(b"", 0), (b"\0", 1)]
    assert send(push, b"api\0", pairs) == len(pairs)
    got = [pull.recv_multipart() for _ in pairs]
    assert got == [control_frames(b"api\0", i, u) for i, u in pairs]
    with pytest.raises(TypeError):
        send(push, b"api\0", [("not bytes", 1)])  # type: ignore[list-item]


@pytest.mark.parametrize("send", SENDS)
def test_both_twins_stop_where_a_paced_sender_must_wait(send: SendControls) -> None:
    """A PUB that refuses at its high-water mark (XPUB_NODROP, as the master's resync
    sends): with ``stop`` the call ends at the first message not taken, and says how many
    went; without, it skips those and goes on."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub, sub = ctx.socket(zmq.PUB), ctx.socket(zmq.SUB)
    try:
        pub.setsockopt(zmq.SNDHWM, 10)
        pub.setsockopt(zmq.XPUB_NODROP, 1)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        sub.setsockopt(zmq.RCVHWM, 10)
        sub.subscribe(b"api\0")
        sub.connect(f"tcp://127.0.0.1:{port}")
        pairs = [(b"id%d" % i, 1_700_000_000_000 + i) for i in range(100_000)]

        def subscribed() -> bool:  # a PUB with no subscriber takes (and drops) everything
            send(pub, b"api\0", [(b"probe", 1)], True)
            return bool(sub.poll(100))

        wait_for(subscribed)
        while sub.poll(200):
            sub.recv_multipart()  # the probes
        sent = send(pub, b"api\0", pairs, True)
        assert 0 < sent < len(pairs)  # the queues filled up: it stopped
        got = [sub.recv_multipart() for _ in range(sent)]  # exactly those, in order
        assert got == [control_frames(b"api\0", i, u) for i, u in pairs[:sent]]
        assert send(pub, b"api\0", pairs, False) < len(pairs)  # skipped, not stopped
    finally:
        pub.close(0)
        sub.close(0)
        ctx.term()
