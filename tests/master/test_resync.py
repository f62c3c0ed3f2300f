"""RESYNC on the master: the engine's part (pure, injected clock), each store's listing of
live states, and the handshake over real sockets on 127.0.0.1 (memory and Redis)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import zmq

from smockron.core.rules import Rule
from smockron.master import answers
from smockron.master.answers import RESYNC_EVERY_S
from smockron.master.domains import DomainPolicy
from smockron.master.engine import Engine
from smockron.master.stores import MemoryStore, Scope, open_store
from smockron.master.stores.base import State
from smockron.master.stores.memory import MemoryTable, memory_states
from smockron.wire.codec import (
    ACCEPTED,
    DELAY_UNTIL,
    PUBLISHED,
    RESYNC,
    RESYNCDONE,
    RESYNCSTART,
    RULES,
    RULES_TOPIC,
    decode_control,
    decode_published,
    encode_accounting,
    encode_resync,
)
from tests.master.running import running_master, settings
from tests.support import RedisServer

T0 = 1_700_000_000_000


def _held(eng: Engine, scope: Scope) -> list[tuple[bytes, State]]:
    """What a memory table holds, as tuples (a history table holds them packed)."""
    table = eng.store.table(scope)
    assert isinstance(table, MemoryTable)
    return memory_states(table, 1000)


def _engine(algorithm: str = "history", *rules: Rule) -> Engine:
    policy = DomainPolicy(rules or (Rule(1.0, 2),), algorithm)
    return Engine({"api": policy}, MemoryStore())


def _throttle(eng: Engine, ident: bytes, n: int, now: int) -> list[list[bytes]]:
    batch = [encode_accounting("api", ACCEPTED, ident, now) for _ in range(n)]
    return eng.process(batch, now)


def test_resync_request_is_collected_not_malformed() -> None:
    eng = _engine()
    eng.process([encode_resync("api"), encode_resync("api"), encode_resync("nope")], T0)
    assert list(eng.resync_wanted) == [("api", None)]
    assert eng.resync_requests == 2
    assert eng.stats.unknown_domain == 1
    assert sum(eng.stats.malformed.values()) == 0


@pytest.mark.parametrize("algorithm", ["history", "gcra", "history-literal"])
def test_live_verdicts_repeat_the_last_verdicts(algorithm: str) -> None:
    eng = _engine(algorithm)
    published = {}
    for ident in (b"a", b"b", b"c"):
        for frames in _throttle(eng, ident, 3, T0):
            published[frames[2]] = decode_control(frames).until_ms
    _throttle(eng, b"polite", 1, T0)  # under its burst: no verdict
    assert set(published) == {b"a", b"b", b"c"}
    scopes = eng.scopes("api")
    states = [_held(eng, s) for s in scopes]
    before = eng.stats.domains["api"].published
    out = {i: u for chunk in eng.live_verdicts("api", states, T0 + 1, 2) for i, u in chunk}
    assert out == published
    assert eng.stats.domains["api"].published == before  # counted by the sender, as sent
    later = max(published.values()) + 1
    assert not any(eng.live_verdicts("api", states, later))  # passed: nothing to repeat


def test_live_verdicts_take_the_latest_rule() -> None:
    eng = _engine("history", Rule(1.0, 2), Rule(1 / 60, 3))
    frames = _throttle(eng, b"x", 3, T0)
    assert frames
    last = decode_control(frames[-1]).until_ms
    scopes = eng.scopes("api")
    states = [_held(eng, s) for s in scopes]
    out = [u for chunk in eng.live_verdicts("api", states, T0) for _i, u in chunk]
    assert out == [last] and last >= T0 + 60_000 - 1


async def _stores_live(url: str, algorithm: str) -> None:
    """Write through one store, reopen it (a restarted master) and list what it keeps."""
    rule = Rule(1 / 60, 1)
    scope = Scope("api", rule, algorithm)
    now = time.time() * 1000
    first = open_store(url)
    eng = Engine({"api": DomainPolicy((rule,), algorithm)}, first)
    first.tick(now)
    eng.apply(
        eng.decode([encode_accounting("api", ACCEPTED, b"id%d" % i, int(now)) for i in range(50)]),
        now,
    )
    await first.flush(wait=True)
    assert len(await first.live(scope, 1000)) == 50  # memory
    await first.close()
    second = open_store(url)
    try:
        states = await second.live(scope, 1000)  # nothing in memory: from the backend
        assert sorted(i for i, _ in states) == sorted(b"id%d" % i for i in range(50))
        assert len(await second.live(scope, 7)) == 7  # bounded
        assert await second.live(Scope("other", rule, algorithm), 10) == []
    finally:
        await second.close()


async def test_redis_store_lists_live_states_after_a_restart(redis_server: RedisServer) -> None:
    await _stores_live(redis_server.url, "history")


async def test_original_layout_lists_live_states(redis_server: RedisServer) -> None:
    await _stores_live(redis_server.url + "?layout=original", "gcra")


async def test_memory_store_lists_live_states() -> None:
    store = MemoryStore()
    rule = Rule(1.0, 1)
    table = store.table(Scope("api", rule, "history"))
    table.put(b"a", (1.0,))
    table.keep(b"b", (2.0,), 10.0)
    table.put(b"b", (3.0,))
    assert sorted(await store.live(Scope("api", rule, "history"), 10)) == [
        (b"a", (1.0,)),
        (b"b", (3.0,)),
    ]
    assert await store.live(Scope("x", rule, "history"), 10) == []


def _came(kind: bytes) -> Callable[[list[list[bytes]]], bool]:
    """Whether a message of ``kind`` is among those read."""
    return lambda out: any(f[1:2] == [kind] for f in out)


class Peer:
    """An original-style gatekeeper on raw sockets: PUB accounting, SUB ``api\\0``."""

    def __init__(self, accounting: str, control: str, topic: bytes = b"api\0") -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 0)  # a flood is sent whole
        self.pub.connect(accounting)
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.subscribe(topic)
        self.sub.connect(control)

    def send(self, frames: list[bytes]) -> None:
        self.pub.send_multipart(frames)

    def read(self, seconds: float) -> list[list[bytes]]:
        out = []
        deadline = time.monotonic() + seconds
        while self.sub.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            out.append(self.sub.recv_multipart())
        return out

    def read_until(
        self, done: bytes | Callable[[list[list[bytes]]], bool], timeout: float = 10.0
    ) -> list[list[bytes]]:
        """What arrives until ``done`` holds of it (a message kind: one of that kind
        came), or ``timeout``."""
        until = _came(done) if isinstance(done, bytes) else done
        out: list[list[bytes]] = []
        deadline = time.monotonic() + timeout
        while not until(out) and time.monotonic() < deadline:
            out.extend(self.read(0.1))
        return out

    def until_answered(self, ident: bytes, timeout: float = 10.0) -> None:
        """Probe with ``ident`` until a DELAY_UNTIL comes back: both ways are live."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.send(encode_accounting("api", ACCEPTED, ident, int(time.time() * 1000)))
            if any(f[1] == DELAY_UNTIL and f[2] == ident for f in self.read(0.1)):
                return
        raise AssertionError("the master never answered")

    def close(self) -> None:
        self.pub.close(0)
        self.sub.close(0)
        self.ctx.term()


@pytest.fixture
def redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "memory":
        yield "memory://"
    else:
        yield request.getfixturevalue("redis_server").url


@pytest.mark.parametrize("redis_url", ["memory", "redis"], indirect=True)
def test_resync_round_trip(redis_url: str) -> None:
    """RESYNCSTART, one DELAY_UNTIL per identifier still delayed, RESYNCDONE; a second
    master on the same Redis (a restart) answers it from Redis."""
    config = settings(redis_url, api="1/60s:1")
    with running_master(config) as master:
        peer = Peer(config.accounting, config.control)
        try:
            peer.until_answered(b"probe")
            now = int(time.time() * 1000)
            for i in range(20):
                peer.send(encode_accounting("api", ACCEPTED, b"abuser%d" % i, now))

            def abusers(got: list[list[bytes]]) -> dict[bytes, bytes]:
                return {f[2]: f[3] for f in got if f[1] == DELAY_UNTIL and f[2] != b"probe"}

            verdicts = abusers(peer.read_until(lambda got: len(abusers(got)) >= 20))
            assert len(verdicts) == 20
            peer.send(encode_resync("api"))
            answer = peer.read_until(RESYNCDONE)
        finally:
            peer.close()
        assert master.resyncs == 1
    assert answer[0] == [b"api\0", RESYNCSTART] and answer[-1] == [b"api\0", RESYNCDONE]
    repeated = {f[2]: f[3] for f in answer[1:-1]}
    assert all(f[1] == DELAY_UNTIL for f in answer[1:-1])
    assert {i: u for i, u in repeated.items() if i != b"probe"} == verdicts
    assert b"probe" in repeated
    if redis_url == "memory://":
        return
    with running_master(config) as second:  # restarted: nothing in memory
        peer = Peer(config.accounting, config.control)
        try:
            deadline = time.monotonic() + 10
            while not second.resyncs and time.monotonic() < deadline:
                peer.send(encode_resync("api"))
                answer = peer.read_until(RESYNCDONE, 0.3)
            if answer and answer[-1][1] != RESYNCDONE:  # answered, not all read yet
                answer += peer.read_until(RESYNCDONE)
        finally:
            peer.close()
    assert answer and answer[0][1] == RESYNCSTART and answer[-1][1] == RESYNCDONE
    assert {f[2]: f[3] for f in answer[1:-1]} == repeated


def test_resync_flood_is_bounded_and_original_subscriber_parses_all() -> None:
    """10,000 RESYNCs in a burst: at most one resync per domain per RESYNC_EVERY_S; live
    verdicts still flow. A ``domain\\0`` subscriber sees only DELAY_UNTIL (4 frames) and
    the two marks (2 frames, as the original's resync branch sends them), never the
    publish counter; a subscriber to everything sees the counter under ``\\0smockron\\0``."""
    config = settings(api="1/60s:1")
    with running_master(config) as master:
        peer = Peer(config.accounting, config.control)
        everything = Peer(config.accounting, config.control, b"")
        try:
            peer.until_answered(b"probe")
            start = time.monotonic()
            for _ in range(10_000):
                peer.send(encode_resync("api"))
            peer.send(encode_accounting("api", ACCEPTED, b"live", int(time.time() * 1000)))
            got = peer.read(1.5)
            elapsed = time.monotonic() - start
            seen = everything.read(0.1)
        finally:
            peer.close()
            everything.close()
        starts = sum(1 for f in got if f[1] == RESYNCSTART)
        assert 1 <= starts <= elapsed / RESYNC_EVERY_S + 1
        assert master.engine.resync_requests == 10_000
    assert any(f[1] == DELAY_UNTIL and f[2] == b"live" for f in got)
    for frames in got:
        assert frames[0] == b"api\0"
        if frames[1] == DELAY_UNTIL:
            assert decode_control(frames).domain == b"api"
        else:
            assert frames[1] in (RESYNCSTART, RESYNCDONE) and len(frames) == 2
    counters = [decode_published(f) for f in seen if f[0] == RULES_TOPIC and f[1] == PUBLISHED]
    # a counter published before the first verdict may say 0; the last one counts them
    assert counters and all(domain == b"api" for domain, _n in counters)
    assert counters[-1][1] >= 2
    assert RESYNC not in {f[1] for f in got}


def test_a_resync_is_answered_at_once_by_an_idle_master(monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle master's answering loops sleep until the engine takes a request (they no
    longer look fifty times a second): a RESYNC is answered within a fraction of a
    second, not at their idle look, which is pushed to a minute here."""
    monkeypatch.setattr(answers, "IDLE_LOOK_S", 60.0)
    config = settings(api="5/s:5")
    with running_master(config) as master:
        peer = Peer(config.accounting, config.control)
        try:
            peer.until_answered(b"probe")
            time.sleep(0.2)  # idle: both loops are waiting to be told
            asked = time.monotonic()
            peer.send(encode_resync("api"))
            got = peer.read_until(RESYNCDONE, 5)
            took = time.monotonic() - asked
        finally:
            peer.close()
        assert got and got[-1][1] == RESYNCDONE, got
        assert took < 1.0, took
        assert master.resyncs == 1


def test_resync_starts_with_the_domains_rules_offer() -> None:
    """A gatekeeper that asks for a RESYNC has just (re)connected: it hears the domain's
    rules offer right before RESYNCSTART, not up to a second later with the periodic
    offer (a master that dies meanwhile would leave it with no first line)."""
    config = settings(api="5/s:5")
    with running_master(config):
        peer = Peer(config.accounting, config.control, b"")
        try:
            peer.until_answered(b"probe")
            peer.send(encode_resync("api"))
            got = peer.read_until(RESYNCSTART)
        finally:
            peer.close()
    starts = [i for i, f in enumerate(got) if f[1] == RESYNCSTART]
    assert starts, got
    before = got[starts[0] - 1]
    assert before[:4] == [RULES_TOPIC, RULES, b"api", b"history"], before
