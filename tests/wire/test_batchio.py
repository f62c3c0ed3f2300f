"""Both receive loops (compiled and pure Python) drain, send and decode the same way."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
import zmq

from smockron.core.rules import Rule
from smockron.master.domains import DomainPolicy
from smockron.master.engine import Engine
from smockron.master.stores.memory import MemoryStore
from smockron.wire.accounting import (
    COMPILED,
    DrainAccounting,
    drain_accounting_compiled,
    drain_accounting_python,
    split_accounting,
)
from smockron.wire.batchio import (
    Drain,
    Readable,
    SendAll,
    drain_compiled,
    drain_python,
    send_all_compiled,
    send_all_python,
    wait_readable,
)
from smockron.wire.codec import DEFAULT_LIMITS, MAX_FRAMES, Oversized, frame_count
from tests.support import twins, wait_for

LOOPS = twins(drain_python, drain_compiled, "_zmqfast")
SENDERS = twins(send_all_python, send_all_compiled, "_zmqfast")


@pytest.mark.parametrize("drain", LOOPS)
def test_drains_batches_without_blocking(
    drain: Drain, pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]
) -> None:
    push, pull = pair
    assert drain(pull, 10) == []
    messages = [
        [b"api\0", b"ACCEPTED", b"id", b"1", b""],
        [b""],
        [b"x" * 70_000],
        [b"f%d" % i for i in range(MAX_FRAMES + 40)],  # the rest is counted, not kept
        [b"api\0", b"ACCEPTED", b"\x00\xff", b"2", b"", b"loginfo"],
        [b"r%d" % i for i in range(MAX_FRAMES)],  # the longest valid message: kept whole
        [b"s%d" % i for i in range(MAX_FRAMES + 1)],
    ]
    for m in messages:
        push.send_multipart(m)
    got: list[list[bytes]] = []

    def received_all() -> bool:
        batch = drain(pull, 2)
        assert len(batch) <= 2
        got.extend(batch)
        return len(got) == len(messages)

    wait_for(received_all)
    assert got[:3] == messages[:3]
    assert got[3] == messages[3][:MAX_FRAMES]
    assert isinstance(got[3], Oversized) and frame_count(got[3]) == MAX_FRAMES + 40
    assert got[4] == messages[4] and type(got[4]) is list
    assert got[5] == messages[5] and type(got[5]) is list
    assert isinstance(got[6], Oversized) and got[6].total == MAX_FRAMES + 1


def test_compiled_and_python_readers_agree_on_every_length(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    """Same batches, same types, same counts, from 1 to far past MAX_FRAMES frames."""
    if drain_compiled is None:
        pytest.skip("smockron.wire._zmqfast is not built")
    push, pull = pair
    lengths = [1, 2, 4, 5, 6, 7, MAX_FRAMES - 1, MAX_FRAMES, MAX_FRAMES + 1, 500, 10_000]
    results = []
    for reader in (drain_python, drain_compiled):
        for n in lengths:
            push.send_multipart([b"%d" % i for i in range(n)])
        got: list[list[bytes]] = []

        def received_all(reader: Drain = reader, got: list[list[bytes]] = got) -> bool:
            got.extend(reader(pull, 3))
            return len(got) == len(lengths)

        wait_for(received_all)
        results.append([(type(m).__name__, list(m), frame_count(m)) for m in got])
    assert results[0] == results[1]
    assert [count for _t, _m, count in results[0]] == lengths


@pytest.mark.parametrize("drain", LOOPS)
def test_closed_socket_raises(drain: Drain) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.close()
    ctx.term()
    with pytest.raises((zmq.ZMQError, ValueError)):
        drain(sock, 1)


async def test_wait_readable(pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]) -> None:
    push, pull = pair
    await wait_readable(pull, 0.05)  # times out quietly
    push.send(b"x")
    await wait_readable(pull, 5.0)
    assert drain_python(pull, 5) == [[b"x"]]


async def test_readable_waits_after_each_drain(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    """The master's receive loop: drain, wait, a message comes, drain, wait again; the
    FD stays watched in between."""
    push, pull = pair
    loop = asyncio.get_running_loop()
    readable = Readable(pull, loop)
    try:
        started = loop.time()
        while loop.time() - started < 0.05:  # nothing: times out quietly (or wakes for
            await readable.wait(0.05)  # libzmq's commands, the connection's first)
            assert drain_python(pull, 5) == []
        for i in range(3):
            waiting = asyncio.create_task(readable.wait(5.0))
            await asyncio.sleep(0.02)
            assert not waiting.done()
            push.send(b"m%d" % i)
            await asyncio.wait_for(waiting, 2.0)
            assert drain_python(pull, 5) == [[b"m%d" % i]]
        push.send(b"early")  # there before the wait: no waiting at all
        await asyncio.sleep(0.02)
        started = loop.time()
        await readable.wait(5.0)
        assert loop.time() - started < 1.0
        assert drain_python(pull, 5) == [[b"early"]]
    finally:
        readable.close()
    assert not loop.remove_reader(readable.fd)  # closed: no longer watched


@pytest.mark.parametrize("send_all", SENDERS)
def test_send_all_sends_whole_messages(
    send_all: SendAll, pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]]
) -> None:
    push, pull = pair
    messages = [[b"api\0", b"DELAY_UNTIL", b"id%d" % i, b"%d" % i] for i in range(100)]
    messages.append([b"single"])
    assert send_all(push, messages) == 101
    got: list[list[bytes]] = []

    def received_all() -> bool:
        got.extend(drain_python(pull, 1000))
        return len(got) == len(messages)

    wait_for(received_all)
    assert got == messages


@pytest.mark.parametrize("send_all", SENDERS)
def test_send_all_skips_what_the_socket_cannot_take(send_all: SendAll) -> None:
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)  # no peer: a PUSH cannot take anything
    push.setsockopt(zmq.LINGER, 0)
    try:
        assert send_all(push, [[b"a", b"b"], [b"c"]]) == 0
        with pytest.raises(TypeError):
            send_all(push, [[b"a", "not bytes"]])  # type: ignore[list-item]
    finally:
        push.close()
        ctx.term()


@pytest.mark.parametrize("send_all", SENDERS)
def test_send_all_error_says_how_many_went_out(send_all: SendAll) -> None:
    """A REQ socket takes one request and then refuses (EFSM): a real mid-batch error."""
    ctx = zmq.Context()
    rep = ctx.socket(zmq.REP)
    port = rep.bind_to_random_port("tcp://127.0.0.1")
    req = ctx.socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.connect(f"tcp://127.0.0.1:{port}")
    try:
        wait_for(lambda: req.poll(0, zmq.POLLOUT) != 0)
        with pytest.raises(zmq.ZMQError) as caught:
            send_all(req, [[b"one", b"request"], [b"two"], [b"three"]])
        assert caught.value.errno == zmq.EFSM
        assert caught.value.sent == 1  # type: ignore[attr-defined]
        assert rep.recv_multipart() == [b"one", b"request"]
    finally:
        req.close()
        rep.close(0)
        ctx.term()


DECODERS = twins(
    drain_accounting_python, drain_accounting_compiled if COMPILED else None, "_zmqfast"
)


@pytest.mark.parametrize("drain_accounting", DECODERS)
def test_both_decoders_split_as_the_codec_contract_says(
    drain_accounting: DrainAccounting[Any],
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    push, pull = pair
    messages: list[list[bytes]] = [
        [b"api\0", b"ACCEPTED", b"a", b"1700000000000", b""],
        [b"api\0", b"DELAYED", b"a", b"1700000000000", b"1700000001000"],
        [b"api\0", b"REJECTED", b"a", b"1700000000000", b""],
        [b"api\0", b"ACCEPTED", b"a", b"0001700000000000", b"", b"UA: x"],
        [b"api\0", b"ACCEPTED", b"a" * 1025, b"1", b""],
        [b"api\0", b"ACCEPTED", b"a", b"99999999999999999", b""],
        [b"api\0", b"ACCEPTED", b"a", b"9999999999999999", b""],
        [b"api\0", b"ACCEPTED", b"a", b"+1", b""],
        [b"api\0", b"ACCEPTED", b"a", b"", b""],
        [b"api\0", b"DELAYED", b"a", b"1", b""],
        [b"api\0", b"DELAYED", b"a", b"1", b"x"],
        [b"api\0", b"REJECTED", b"a", b"1", b"2"],
        [b"api\0", b"ACCEPTEDX", b"a", b"1", b""],
        [b"api\0", b"ACCEPTED", b"a", b"1", b"", b"x" * 9000],
        [b"api\0", b"ACCEPTED", b"a", b"1", b"", b"l", b"extra"],
        [b"other\0", b"ACCEPTED", b"a", b"1", b""],
        [b"api", b"ACCEPTED", b"a", b"1", b""],
        [b"api\0"],
        [b"x%d" % i for i in range(30)],
        [b"api\0", *(b"y%d" % i for i in range(MAX_FRAMES + 30))],
        [b"api\0", b"ACCEPTED", b"\0\xff", b"5", b""],
    ]
    for m in messages:
        push.send_multipart(m)

    def engine() -> Engine:
        return Engine({"api": DomainPolicy((Rule(1.0, 1),))}, MemoryStore())

    received, python = engine(), engine()
    decoded: list[Any] = []
    raw: list[Sequence[bytes]] = []

    def received_all() -> bool:
        d, r = drain_accounting(pull, 7, received.topics, DEFAULT_LIMITS)
        assert len(d) + len(r) <= 7
        decoded.extend(d)
        raw.extend(r)
        return len(decoded) + len(raw) == len(messages)

    wait_for(received_all)
    assert len(decoded) == 5  # the plainly valid ones for "api"
    pure = split_accounting(messages, received.topics, DEFAULT_LIMITS)
    assert (decoded, [list(m) for m in raw]) == (pure[0], [m[:MAX_FRAMES] for m in pure[1]])
    assert [frame_count(m) for m in raw] == [len(m) for m in pure[1]]
    got = received.ingest(decoded, raw)
    expected = python.decode(messages)
    key = lambda d: (d[1], d[2], d[3], d[4])  # noqa: E731
    assert sorted(map(key, got)) == sorted(map(key, expected))
    assert received.stats.summary() == python.stats.summary()
    assert received.stats.malformed == python.stats.malformed
