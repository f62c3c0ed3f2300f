"""A fleet of masters over real ZeroMQ sockets on 127.0.0.1: shard topics, warm start
from a peer, private RESYNC answers, and the backlog rule a bare connection cannot abuse."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import zmq

from smockron.core.rules import Rule
from smockron.core.shards import SHARDS, owned, shard_of, shard_topic
from smockron.master.config import MasterSettings
from smockron.master.domains import DomainPolicy
from smockron.master.engine import Engine
from smockron.master.fleet import GONE_S, Fleet, Peer, PeerWatch, merge_state
from smockron.master.stores import MemoryStore, Scope
from smockron.wire.codec import (
    ACCEPTED,
    DELAY_UNTIL,
    RESYNCDONE,
    RESYNCSTART,
    decode_control,
    encode_accounting,
    encode_rules,
    topic,
)
from smockron.wire.fleet import encode_private_resync, resync_reply
from tests.master.running import running_master, settings
from tests.support import wait_for

T0 = 1_700_000_000_000.0


def peered(a: MasterSettings, b: MasterSettings) -> tuple[MasterSettings, MasterSettings]:
    """Two masters' settings, each naming the other as its peer."""
    return (
        dataclasses.replace(a, peers=(f"{b.accounting},{b.control}",)),
        dataclasses.replace(b, peers=(f"{a.accounting},{a.control}",)),
    )


@contextmanager
def gatekeeper_sockets(
    *masters: MasterSettings, topics: tuple[bytes, ...] = (b"api\0",)
) -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    """A raw gatekeeper: one PUB connected to every master, one SUB to their controls;
    yielded once every master's handshake is done and its subscriptions have come
    (sent before, accounting would be dropped: a loaded machine takes its time)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub, sub = ctx.socket(zmq.XPUB), ctx.socket(zmq.SUB)  # an XPUB sends as a PUB does
    pub.setsockopt(zmq.XPUB_VERBOSE, 1)
    # no high-water mark: a test's burst (2,000 messages) must not be dropped here when a
    # loaded machine runs this socket's I/O thread late (at the default 1,000 it was)
    pub.setsockopt(zmq.SNDHWM, 0)
    for sock in (pub, sub):
        sock.setsockopt(zmq.LINGER, 0)
    for t in topics:
        sub.subscribe(t)
    monitor = pub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    for m in masters:
        pub.connect(m.accounting)
        sub.connect(m.control)
    handshakes = 0
    deadline = time.monotonic() + 10
    while handshakes < len(masters) and time.monotonic() < deadline:
        if monitor.poll(100):
            monitor.recv_multipart()
            handshakes += 1
    pub.disable_monitor()
    monitor.close(0)
    subscribed = 0
    while pub.poll(300 if subscribed else 10_000):  # each master's come together
        subscribed += pub.recv()[:1] == b"\x01"
    time.sleep(0.3)  # the SUB's own subscriptions, at the masters
    try:
        yield pub, sub
    finally:
        pub.close(0)
        sub.close(0)
        ctx.term()


def controls(sub: zmq.Socket[bytes], seconds: float) -> list[list[bytes]]:
    out: list[list[bytes]] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if sub.poll(50):
            out.append(sub.recv_multipart())
    return out


def sharded(ident: bytes, at: int) -> list[bytes]:
    """An ACCEPTED for ``ident`` at ``at`` on its shard's topic, as a gatekeeper that
    follows a fleet sends it."""
    frames = encode_accounting("api", ACCEPTED, ident, at)
    return [shard_topic(shard_of(ident), b"api\0"), *frames[1:]]


def test_shard_topics_decode_to_their_domain() -> None:
    """A fleet master takes its shards' topics as the domain's; a fleet of one takes all."""
    rules = {"api": DomainPolicy((Rule(1.0, 1),))}
    mine = owned("a", ["a", "b", "c"], 1)
    eng = Engine(rules, MemoryStore(), shards=mine)
    ident = next(b"id-%d" % i for i in range(1000) if shard_of(b"id-%d" % i) in mine)
    other = next(b"id-%d" % i for i in range(1000) if shard_of(b"id-%d" % i) not in mine)
    eng.process([sharded(ident, int(T0))] * 2, T0)
    assert eng.stats.domain("api").accepted == 2
    eng.process([sharded(other, int(T0))], T0)
    # not ours (the SUB never subscribes to it): not taken, counted as malformed
    assert eng.stats.domain("api").accepted == 2 and sum(eng.stats.malformed.values()) == 1
    alone = Engine(rules, MemoryStore())
    assert all(shard_topic(s, b"api\0") in alone.topics for s in range(SHARDS))


def test_a_connection_does_not_make_an_on_time_gatekeeper_late() -> None:
    """A gatekeeper 600 ms behind, within the skew tolerance: a connection accepted just
    before (a rogue's bare connect) changes nothing about how it is charged."""
    rules = {"api": DomainPolicy((Rule(1.0, 1),))}
    eng = Engine(rules, MemoryStore(), skew_tolerance_ms=2000.0)
    eng.connected(T0)
    behind = encode_accounting("api", ACCEPTED, b"abuser", int(T0 + 100 - 600))
    out = eng.apply(eng.decode([behind, behind]), T0 + 100, T0 + 100)
    assert eng.stats.domain("api").late == 0
    assert {decode_control(c).identifier for c in out} == {b"abuser"}  # both charged
    backlog = encode_accounting("api", ACCEPTED, b"polite", int(T0 - 5000))
    eng.apply(eng.decode([backlog]), T0 + 200, T0 + 200)
    assert eng.stats.domain("api").late == 1  # an outage's backlog is still not charged


def test_a_master_behind_judges_by_arrival() -> None:
    """Messages that arrived on time and were processed 3 s later (a master behind on
    its queue) are neither late nor skewed."""
    rules = {"api": DomainPolicy((Rule(1.0, 1),))}
    eng = Engine(rules, MemoryStore(), skew_tolerance_ms=2000.0)
    eng.connected(T0)
    msg = encode_accounting("api", ACCEPTED, b"client", int(T0))
    eng.apply(eng.decode([msg, msg]), T0 + 3000, T0 + 10)
    stats = eng.stats.domain("api")
    assert (stats.late, stats.skewed, stats.accepted) == (0, 0, 2)


def test_merge_takes_the_union_of_histories_and_the_later_gcra() -> None:
    rule = Rule(1.0, 3)
    history, gcra = Scope("api", rule, "history"), Scope("api", rule, "gcra")
    assert merge_state((1.0, 2.0), (2.0, 3.0), history) == (1.0, 2.0, 3.0)
    assert merge_state((1.0, 2.0, 3.0), (4.0,), history) == (2.0, 3.0, 4.0)
    assert merge_state(None, (5.0,), gcra) == (5.0,)
    assert merge_state((7.0,), (5.0,), gcra) == (7.0,)


def test_both_masters_hold_every_identifier_and_a_restarted_one_takes_the_state() -> None:
    """Two peered masters each receive every message (two replicas of every shard); one
    restarted takes the other's states before it is ready, so its first verdict for an
    abuser comes at the abuser's next request, not a burst later."""
    a, b = peered(settings(api="1/60s:5"), settings(api="1/60s:5"))
    now = int(time.time() * 1000)
    abuser = b"abuser"
    msg = sharded(abuser, now)
    with running_master(a) as ma:
        with running_master(b) as mb:
            wait_for(lambda: mb.warm is not None and mb.warm.problem is None, 10)
            with gatekeeper_sockets(a, b) as (pub, sub):
                for _ in range(5):
                    pub.send_multipart(msg)
                got = controls(sub, 1.0)
                assert len(got) == 2  # the fifth request: one DELAY_UNTIL from each
                assert {decode_control(c).identifier for c in got} == {abuser}
        # b is gone; a held everything on its own
        with running_master(b) as mb2:
            wait_for(lambda: mb2.warm is not None and mb2.warm.problem is None, 10)
            assert mb2.warm is not None and mb2.warm.states >= 1 and mb2.warm.answered == 1
            assert ma.answers.syncs >= 1
            with gatekeeper_sockets(b) as (pub, sub):  # b alone
                pub.send_multipart([msg[0], msg[1], abuser, b"%d" % int(time.time() * 1000), b""])
                got = controls(sub, 1.0)
                assert [decode_control(c).identifier for c in got] == [abuser]


def test_a_master_with_no_peer_up_starts_on_its_own() -> None:
    a = dataclasses.replace(settings(api="1/s:1"), peers=("tcp://127.0.0.1:9,tcp://127.0.0.1:9",))
    with running_master(a) as ma:
        assert ma.warm is not None and ma.warm.problem is not None  # not ready yet
        wait_for(lambda: ma.warm is not None and ma.warm.problem is None, 10)
        assert ma.warm is not None and ma.warm.answered == 0


def test_a_private_resync_reaches_only_the_gatekeeper_that_asked() -> None:
    config = settings(api="1/60s:1")
    now = int(time.time() * 1000)
    with running_master(config) as master:
        with gatekeeper_sockets(config) as (pub, bystander):
            for i in range(50):
                pub.send_multipart(encode_accounting("api", ACCEPTED, b"id-%d" % i, now))
            assert len(controls(bystander, 1.0)) == 50  # one live verdict each
            ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
            asker = ctx.socket(zmq.SUB)
            reply = resync_reply(b"token-1")
            asker.subscribe(reply)
            asker.connect(config.control)
            time.sleep(0.3)
            try:
                pub.send_multipart(encode_private_resync(topic("api"), reply))
                answer = controls(asker, 1.5)
            finally:
                asker.close(0)
            assert controls(bystander, 0.2) == []  # the bystander received nothing
        kinds = [frames[1] for frames in answer]
        assert kinds[0] == RESYNCSTART and kinds[-1] == RESYNCDONE
        assert kinds.count(DELAY_UNTIL) == 50
        assert master.stats.domain("api").published == 50  # private answers not counted


def test_a_bad_reply_topic_is_malformed_not_answered() -> None:
    rules = {"api": DomainPolicy((Rule(1.0, 1),))}
    eng = Engine(rules, MemoryStore())
    eng.process([[b"api\0", b"RESYNC", b"api\0stolen"]], T0)
    assert not eng.resync_wanted and eng.stats.malformed["bad_reply"] == 1


def test_a_bare_connect_opens_no_window_for_on_time_traffic() -> None:
    """End to end: a rogue connects to the accounting port once every 200 ms while a
    gatekeeper 600 ms behind sends an abuser's traffic: every request is charged."""
    config = settings(api="1/60s:1")
    port = int(config.accounting.rsplit(":", 1)[1])
    with running_master(config) as master, gatekeeper_sockets(config) as (pub, sub):
        for i in range(10):
            with socket.create_connection(("127.0.0.1", port)):
                pass
            stamp = int(time.time() * 1000) - 600
            pub.send_multipart(encode_accounting("api", ACCEPTED, b"abuser-%d" % i, stamp))
            time.sleep(0.2)
        got = controls(sub, 0.5)
        assert master.stats.domain("api").late == 0
        assert len(got) == 10


def test_one_list_for_every_master_of_a_fleet() -> None:
    """Each master may be given the whole fleet: its own entry is not a peer."""
    me = "tcp://m0.fleet:10004,tcp://m0.fleet:10005"
    other = "tcp://m1.fleet:10004,tcp://m1.fleet:10005"
    config = MasterSettings(advertise=me, peers=(me, other))
    assert config.peers == (other,) and config.name == "tcp://m0.fleet:10004"


def test_the_middleware_follows_a_fleet() -> None:
    """``masters=`` reaches the middleware's gatekeeper (as docs/fleet.md shows)."""
    from smockron.gatekeeper import SmockronMiddleware

    async def app(scope: object, receive: object, send: object) -> None:
        return None

    fleet = ["tcp://127.0.0.1:1,tcp://127.0.0.1:2", "tcp://127.0.0.1:3,tcp://127.0.0.1:4"]
    middleware = SmockronMiddleware(app, domain="api", masters=fleet, registry=None)
    assert middleware.gatekeeper.masters == [
        ("tcp://127.0.0.1:1", "tcp://127.0.0.1:2"),
        ("tcp://127.0.0.1:3", "tcp://127.0.0.1:4"),
    ]
    assert middleware.gatekeeper.sharded


def test_a_gatekeeper_restarted_five_times_costs_a_bystander_nothing() -> None:
    """2,000 live verdicts; a gatekeeper restarted five times gets them all each time
    (private RESYNC answers), a bystander gatekeeper of the same domain receives none of
    them (it would have received five whole resyncs on the domain's topic)."""
    from smockron.gatekeeper import Gatekeeper

    config = settings(api="1/60s:1")
    live = 2000
    now = int(time.time() * 1000)
    with running_master(config) as master, gatekeeper_sockets(config) as (pub, _sub):
        for i in range(live):
            pub.send_multipart(encode_accounting("api", ACCEPTED, b"id-%d" % i, now))
        wait_for(lambda: master.stats.domain("api").published >= live, 30)
        bystander = Gatekeeper(config.accounting, config.control, ["api"])
        try:
            wait_for(lambda: len(bystander.decider.table) >= live, 30)  # its own resync
            before = bystander.counters.control_received
            for _ in range(5):
                restarted = Gatekeeper(config.accounting, config.control, ["api"])
                try:
                    table = restarted.decider.table
                    wait_for(lambda: len(table) >= 0.95 * live, 30)  # noqa: B023
                finally:
                    restarted.close()
            time.sleep(0.5)
            assert bystander.counters.control_received - before <= 0.1 * live
        finally:
            bystander.close()


def test_a_peer_heard_again_after_a_silence_is_asked_for_its_state() -> None:
    """A partition that heals: the peer's rules offers stop for longer than ``GONE_S``,
    then come again; the watch calls back once, when they come again, not while they
    flow nor while they are silent."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    peer_control = ctx.socket(zmq.PUB)
    peer_control.setsockopt(zmq.LINGER, 0)
    port = peer_control.bind_to_random_port("tcp://127.0.0.1")
    me = dataclasses.replace(
        settings(api="1/s:1"), peers=(f"tcp://127.0.0.1:9,tcp://127.0.0.1:{port}",)
    )
    returned: list[Peer] = []
    watch = PeerWatch(ctx, Fleet(me), returned.append)

    async def offers(seconds: float) -> None:
        for _ in range(round(seconds / 0.25)):
            peer_control.send_multipart(encode_rules("api", "history", (Rule(1.0, 1),)))
            await asyncio.sleep(0.25)

    async def scenario() -> None:
        task = asyncio.create_task(watch.run())
        try:
            await offers(2.0)
            assert returned == []  # heard all along
            await asyncio.sleep(GONE_S + 0.5)
            assert returned == []  # silence alone asks nothing
            await offers(1.0)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    try:
        asyncio.run(scenario())
    finally:
        peer_control.close(0)
    assert [p.control for p in returned] == [f"tcp://127.0.0.1:{port}"]


def test_a_master_takes_what_it_missed_from_a_peer_heard_again() -> None:
    """Master a holds an abuser's history that b never saw (sent to a alone, as while b
    was cut off); b then goes silent for longer than ``GONE_S`` (stopped) and comes
    back: a counts the return and merges b's states, and b, restarted, takes a's."""
    a, b = peered(settings(api="1/60s:5"), settings(api="1/60s:5"))
    abuser = b"abuser"
    with running_master(a) as ma:
        with running_master(b) as mb:
            wait_for(lambda: mb.warm is not None and mb.warm.problem is None, 10)
        time.sleep(GONE_S + 0.5)  # b silent
        assert ma.stats.peer_returns == 0
        with running_master(b) as mb2:
            with gatekeeper_sockets(b) as (pub, sub):  # b alone sees these
                for _ in range(5):
                    pub.send_multipart(sharded(abuser, int(time.time() * 1000)))
                assert [decode_control(c).identifier for c in controls(sub, 1.0)] == [abuser]
            wait_for(lambda: ma.stats.peer_returns == 1, 10)
            assert ma.warm is not None
            wait_for(lambda: ma.warm is not None and ma.warm.states >= 1, 10)
            assert mb2.stats.peer_returns == 0  # b heard a from its start: nothing missed
        with gatekeeper_sockets(a) as (pub, sub):  # a now knows the abuser is over
            pub.send_multipart(sharded(abuser, int(time.time() * 1000)))
            assert [decode_control(c).identifier for c in controls(sub, 1.0)] == [abuser]
