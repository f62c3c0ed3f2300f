"""The DThrottle daemon in-process: real sockets (TCP, Unix, UDP unicast and multicast)."""

from __future__ import annotations

import asyncio
import socket
import stat
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from smockron.daemons.dthrottle.algorithm import PrefixRule
from smockron.daemons.dthrottle.config import DThrottleConfig, parse_listen
from smockron.daemons.dthrottle.report import decode_report, encode_report
from smockron.daemons.dthrottle.server import DThrottleDaemon
from tests.support import free_port


class ManualClock:
    """A clock the test moves by hand; the daemon's report schedule follows it."""

    def __init__(self, now: float = 0.0) -> None:
        self.t = now

    def now(self) -> float:
        return self.t

    async def sleep_until(self, when: float) -> None:
        while self.t < when:
            await asyncio.sleep(0.001)


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.002)


def config(**kw: Any) -> DThrottleConfig:
    kw.setdefault("listen", (parse_listen("tcp:127.0.0.1:0"),))
    return DThrottleConfig(**kw)


@pytest.fixture
async def daemon() -> AsyncIterator[DThrottleDaemon]:
    d = DThrottleDaemon(config(burst=3, max_tag_length=16), clock=ManualClock(), stats_every=None)
    await d.start()
    try:
        yield d
    finally:
        await d.stop()


async def query(port: int, payload: bytes, expect: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        return await reader.readexactly(expect)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_exact_replies_and_pipelining(daemon: DThrottleDaemon) -> None:
    port = daemon.tcp_port()
    assert await query(port, b"a\n" * 5 + b"b\n", 18) == b"OK\nOK\nOK\nNO\nNO\nOK\n"
    assert daemon.stats.queries == 6 and daemon.stats.refused == 2


async def test_lines_split_across_reads(daemon: DThrottleDaemon) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.tcp_port())
    try:
        for byte in b"tag-one\ntag-two\n":
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0)
        assert await reader.readexactly(6) == b"OK\nOK\n"
    finally:
        writer.close()
        await writer.wait_closed()


async def test_overlong_line_closes_only_that_connection(daemon: DThrottleDaemon) -> None:
    port = daemon.tcp_port()
    other_r, other_w = await asyncio.open_connection("127.0.0.1", port)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"ok-tag\n" + b"x" * 17 + b"\nnever-answered\n")
    assert await reader.read() == b"OK\n"  # the answer before it, then EOF
    writer.close()
    await writer.wait_closed()
    # an overlong line without its newline yet is caught too: the daemon closes at once
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"y" * 100)
    async with asyncio.timeout(5):
        assert await reader.read() == b""
    writer.close()
    await writer.wait_closed()
    other_w.write(b"still-served\n")
    assert await other_r.readexactly(3) == b"OK\n"
    other_w.close()
    await other_w.wait_closed()
    assert daemon.stats.overlong == 2


async def test_a_tag_of_exactly_the_maximum_length_is_served(daemon: DThrottleDaemon) -> None:
    port = daemon.tcp_port()  # the fixture's limit is 16 bytes, the newline not counted
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"m" * 16 + b"\n" + b"\xff" * 15)  # the second one still to come
        assert await reader.readexactly(3) == b"OK\n"
        writer.write(b"\xff\n")
        assert await reader.readexactly(3) == b"OK\n"
        writer.write(b"m" * 17 + b"\n")
        async with asyncio.timeout(5):
            assert await reader.read() == b""
    finally:
        writer.close()
        await writer.wait_closed()
    assert daemon.stats.overlong == 1 and daemon.stats.queries == 2


async def test_thousands_of_concurrent_connections(daemon: DThrottleDaemon) -> None:
    port = daemon.tcp_port()
    conns = []
    try:
        for i in range(0, 2000, 200):
            conns += await asyncio.gather(
                *(asyncio.open_connection("127.0.0.1", port) for _ in range(200))
            )
            assert len(conns) == i + 200
        await until(lambda: daemon.stats.open_connections == 2000)
        for i, (_, w) in enumerate(conns):
            w.write(b"client-%d\n" % i)
        replies = await asyncio.gather(*(r.readexactly(3) for r, _ in conns))
        assert set(replies) == {b"OK\n"}
    finally:
        for _, w in conns:
            w.close()
        await asyncio.gather(*(w.wait_closed() for _, w in conns), return_exceptions=True)
    await until(lambda: daemon.stats.open_connections == 0)


async def test_unix_socket_and_stale_file(tmp_path: Path) -> None:
    path = tmp_path / "dt.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))  # a socket file nobody listens on: left by a crash
    stale.close()
    d = DThrottleDaemon(
        config(listen=(parse_listen(f"unix:{path}"),)), clock=ManualClock(), stats_every=None
    )
    await d.start()
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o660  # owner and group only
        reader, writer = await asyncio.open_unix_connection(str(path))
        writer.write(b"u\n" * 11)
        assert await reader.readexactly(33) == b"OK\n" * 10 + b"NO\n"
        writer.close()
        await writer.wait_closed()
    finally:
        await d.stop()
    assert not path.exists()


async def test_a_live_unix_socket_is_not_stolen(tmp_path: Path) -> None:
    from smockron.errors import ConfigError

    path = tmp_path / "dt.sock"
    cfg = config(listen=(parse_listen(f"unix:{path}"),))
    first = DThrottleDaemon(cfg, clock=ManualClock(), stats_every=None)
    await first.start()
    try:
        second = DThrottleDaemon(cfg, clock=ManualClock(), stats_every=None)
        with pytest.raises(ConfigError, match="another process is serving on"):
            await second.start()
        reader, writer = await asyncio.open_unix_connection(str(path))
        writer.write(b"still-mine\n")  # the first daemon still owns the path
        assert await reader.readexactly(3) == b"OK\n"
        writer.close()
        await writer.wait_closed()
        assert first.stats.queries == 1
    finally:
        await first.stop()
    assert not path.exists()


async def test_rules_and_whitelist_over_the_wire() -> None:
    cfg = config(burst=1, rules=(PrefixRule(b"api:", 2, 1.0),), whitelist=(b"ops:",))
    d = DThrottleDaemon(cfg, clock=ManualClock(), stats_every=None)
    await d.start()
    try:
        out = await query(d.tcp_port(), b"api:x\n" * 3 + b"ops:y\n" * 3 + b"z\n" * 2, 24)
        assert out == b"OK\nOK\nNO\n" + b"OK\n" * 3 + b"OK\nNO\n"
    finally:
        await d.stop()


async def pair(**kw: Any) -> tuple[DThrottleDaemon, DThrottleDaemon, ManualClock]:
    clock = ManualClock()
    pa, pb = free_port(), free_port()
    a = DThrottleDaemon(
        config(peer_bind=("127.0.0.1", pa), peers=(("127.0.0.1", pb),), **kw),
        clock=clock,
        stats_every=None,
    )
    b = DThrottleDaemon(
        config(peer_bind=("127.0.0.1", pb), peers=(("127.0.0.1", pa),), **kw),
        clock=clock,
        stats_every=None,
    )
    await a.start()
    await b.start()
    return a, b, clock


async def test_garbage_datagrams_are_counted_and_never_stop_the_daemon() -> None:
    a, b, _clock = await pair()
    try:
        udp_port = free_port()
        target = ("127.0.0.1", a.config.peer_bind[1])  # type: ignore[index]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", udp_port))
            for junk in (b"", b"hello", b"DT\x01" + b"\xff" * 40, b"DT\x09" + bytes(30)):
                s.sendto(junk, target)
        await until(lambda: sum(a.stats.garbage.values()) == 4)
        assert a.stats.garbage["short"] == 2 and a.stats.garbage["bad_version"] == 1
        assert await query(a.tcp_port(), b"t\n", 3) == b"OK\n"
    finally:
        await a.stop()
        await b.stop()


async def test_large_report_is_split_and_fully_applied() -> None:
    a, b, _clock = await pair(burst=1)
    try:
        tags = [b"client-%05d" % i for i in range(3000)]
        assert await query(a.tcp_port(), b"".join(t + b"\n" for t in tags), 9000) == b"OK\n" * 3000
        sent = a.report_now()
        assert sent > 30
        await until(lambda: b.stats.parts_applied == sent)
        assert await query(b.tcp_port(), tags[0] + b"\n" + tags[-1] + b"\n", 6) == b"NO\nNO\n"
    finally:
        await a.stop()
        await b.stop()


async def test_duplicate_and_own_datagrams_are_ignored() -> None:
    a, b, clock = await pair(burst=5)
    try:
        [datagram] = encode_report(12345, 1, {b"dup": 2})
        target = ("127.0.0.1", b.config.peer_bind[1])  # type: ignore[index]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(datagram, target)
            s.sendto(datagram, target)
            s.sendto(encode_report(b.sender_id, 1, {b"dup": 2})[0], target)
        await until(lambda: b.stats.datagrams_received == 3)
        assert (b.stats.parts_applied, b.stats.duplicates, b.stats.own_echoes) == (1, 1, 1)
        assert b.throttle.balance(b"dup", clock.now()) == 3
    finally:
        await a.stop()
        await b.stop()


async def test_reports_follow_the_injected_clock_over_unicast() -> None:
    a, b, clock = await pair()
    try:
        assert await query(a.tcp_port(), b"C\n" * 9, 27) == b"OK\n" * 9
        clock.t = 4.9
        await asyncio.sleep(0.05)
        assert b.stats.parts_applied == 0  # not due yet
        clock.t = 5.0
        await until(lambda: b.stats.parts_applied == 1)
        assert b.throttle.balance(b"C", 5.0) == 1
    finally:
        await a.stop()
        await b.stop()


def multicast_config(port: int) -> DThrottleConfig:
    return config(multicast=("239.255.69.70", port), multicast_interface="127.0.0.1")


async def test_multicast_on_loopback() -> None:
    port = free_port()
    clock = ManualClock()
    daemons = [
        DThrottleDaemon(multicast_config(port), clock=clock, stats_every=None) for _ in range(3)
    ]
    for d in daemons:
        await d.start()
    try:
        a, b, c = daemons
        assert await query(a.tcp_port(), b"M\n" * 7, 21) == b"OK\n" * 7
        assert a.report_now() == 1
        await until(lambda: b.stats.parts_applied == 1 and c.stats.parts_applied == 1)
        await until(lambda: a.stats.own_echoes == 1)  # our own report came back, ignored
        assert b.throttle.balance(b"M", 0.0) == 3 == c.throttle.balance(b"M", 0.0)
        assert a.stats.parts_applied == 0
    finally:
        for d in daemons:
            await d.stop()


async def test_any_chunking_of_a_pipelined_stream_gives_the_same_answers(
    daemon: DThrottleDaemon,
) -> None:
    import random

    rng = random.Random(7)
    tags = [b"t%d" % rng.randrange(6) for _ in range(300)]
    stream = b"".join(t + b"\n" for t in tags)
    expected = DThrottleDaemon(daemon.config, clock=ManualClock()).answer(tags)
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.tcp_port())
    try:
        pos = 0
        while pos < len(stream):
            step = rng.choice([1, 2, 3, 7, 50, 400])
            writer.write(stream[pos : pos + step])
            await writer.drain()
            pos += step
        assert await reader.readexactly(900) == expected
    finally:
        writer.close()
        await writer.wait_closed()


async def test_client_half_close_still_gets_every_answer(daemon: DThrottleDaemon) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon.tcp_port())
    writer.write(b"h\n" * 4)
    writer.write_eof()
    assert await reader.read() == b"OK\nOK\nOK\nNO\n"
    writer.close()
    await writer.wait_closed()


async def test_stats_line_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="smockron.dthrottle")
    d = DThrottleDaemon(config(), clock=ManualClock(), stats_every=0.02)
    await d.start()
    try:
        await query(d.tcp_port(), b"s\n", 3)
        await until(lambda: "queries=1 refused=0" in caplog.text)
    finally:
        await d.stop()


async def test_a_peer_that_is_down_costs_nothing_but_its_reports() -> None:
    dead = free_port()  # nobody listens there: the sends bounce (ICMP port unreachable)
    d = DThrottleDaemon(
        config(burst=2, peer_bind=("127.0.0.1", free_port()), peers=(("127.0.0.1", dead),)),
        clock=ManualClock(),
        stats_every=None,
    )
    await d.start()
    try:
        for i in range(5):
            assert await query(d.tcp_port(), b"p%d\n" % i, 3) == b"OK\n"
            assert d.report_now() == 1
            await asyncio.sleep(0.01)
        assert await query(d.tcp_port(), b"p0\np0\np0\n", 9) == b"OK\nNO\nNO\n"
        assert d.stats.reports_sent == 5
    finally:
        await d.stop()


async def test_unicast_drops_datagrams_from_unlisted_addresses() -> None:
    from smockron.daemons.dthrottle.peers import UnicastPeers

    a, b, _clock = await pair()
    try:
        [datagram] = encode_report(999, 1, {b"s": 5})
        target = ("127.0.0.1", a.config.peer_bind[1])  # type: ignore[index]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.2", 0))  # loopback, but not the listed peer 127.0.0.1
            s.sendto(datagram, target)
        [unicast] = a.transports
        assert isinstance(unicast, UnicastPeers)
        await until(lambda: unicast.strangers == 1)
        assert a.stats.datagrams_received == 0
    finally:
        await a.stop()
        await b.stop()


async def test_a_client_that_pipelines_without_reading_is_paused_not_buffered() -> None:
    """The daemon stops reading a client whose replies pile up, and resumes when it reads."""
    d = DThrottleDaemon(config(burst=10**9), clock=ManualClock(), stats_every=None)
    await d.start()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # little room for replies
    s.connect(("127.0.0.1", d.tcp_port()))
    s.setblocking(False)
    chunk = b"q\n" * 32768
    sent = 0
    try:
        async with asyncio.timeout(30):
            stalled = 0
            while stalled < 100:  # 100 refused sends in a row: the daemon is not reading
                try:
                    sent += s.send(chunk[sent % 2 :])  # an odd count ends inside a "q\n"
                    stalled = 0
                    await asyncio.sleep(0)
                except BlockingIOError:
                    stalled += 1
                    await asyncio.sleep(0.002)
                assert sent < 32 << 20, "the daemon kept reading a client that never reads"
            queries = sent // 2
            answered = d.stats.queries
            await asyncio.sleep(0.05)
            assert d.stats.queries == answered < queries
            replies = bytearray()
            while len(replies) < 3 * queries:  # reading lets the daemon read on
                try:
                    data = s.recv(1 << 16)
                except BlockingIOError:
                    await asyncio.sleep(0.001)
                    continue
                assert data, "connection closed early"
                replies += data
        assert replies == b"OK\n" * queries
        assert d.stats.queries == queries
    finally:
        s.close()
        await d.stop()


async def test_a_lost_part_loses_only_its_own_tags() -> None:
    a, b, clock = await pair(burst=5)
    try:
        hits = {b"tag-%03d" % i: 2 for i in range(200)}
        parts = encode_report(4242, 1, hits, max_datagram=600)
        assert len(parts) >= 3
        target = ("127.0.0.1", b.config.peer_bind[1])  # type: ignore[index]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for datagram in parts[1:]:  # part 0 is lost on the way
                s.sendto(datagram, target)
        await until(lambda: b.stats.parts_applied == len(parts) - 1)
        lost = list(decode_report(parts[0]).hits)
        assert lost and all(b.throttle.balance(t, clock.now()) == 5 for t in lost)
        arrived = [t for t in hits if t not in lost]
        assert all(b.throttle.balance(t, clock.now()) == 3 for t in arrived)
        assert await query(b.tcp_port(), lost[0] + b"\n" + arrived[-1] + b"\n", 6) == b"OK\nOK\n"
    finally:
        await a.stop()
        await b.stop()


async def test_burst_ten_serves_ten_on_separate_connections_a_few_ms_apart() -> None:
    """The original DThrottle's worked example (burst 10, rate 1/s) on the real clock:
    12 queries, each on its own connection, a few ms apart, answer 10 OK, as 12 pipelined
    in one write do (the sliver refilled between them bought an 11th)."""
    d = DThrottleDaemon(config(burst=10, rate=1.0), stats_every=None)
    await d.start()
    try:
        answers = []
        started = time.monotonic()
        for _ in range(12):
            answers.append(await query(d.tcp_port(), b"client-c\n", 3))
            await asyncio.sleep(0.003)
        refilled = int(time.monotonic() - started)  # whole tokens back (0 unless very slow)
        assert answers.count(b"OK\n") == 10 + min(refilled, 2), answers
        assert await query(d.tcp_port(), b"client-d\n" * 12, 36) == b"OK\n" * 10 + b"NO\n" * 2
    finally:
        await d.stop()


async def test_new_tags_with_a_slow_refill_stay_within_max_entries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Burst 3, 0.001/s: a bucket leaves the table only once full again (50 minutes), so
    one client sending new tags grew it without end (8.1 million buckets, 1.64 GB in a
    minute). At ``max_entries`` the fullest of the oldest go, counted and logged."""
    clock = ManualClock()
    d = DThrottleDaemon(
        config(burst=3, rate=0.001, max_entries=1024), clock=clock, stats_every=None
    )
    await d.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", d.tcp_port())
        for chunk in range(20):
            tags = b"".join(b"scan-%d-%d\n" % (chunk, i) for i in range(500))
            writer.write(tags)
            assert await reader.readexactly(1500) == b"OK\n" * 500
            assert len(d.throttle.buckets) <= 1024
        writer.close()
        await writer.wait_closed()
        assert d.throttle.evicted == 20 * 500 - len(d.throttle.buckets)
        assert d.counters()["evicted"] == d.throttle.evicted
        with caplog.at_level("WARNING", logger="smockron.dthrottle"):
            d.report_now()
        assert "bucket table full (max_entries 1024)" in caplog.text
    finally:
        await d.stop()
