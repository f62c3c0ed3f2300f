"""``smockron router`` in front of two real masters (processes), with a real smockron
gatekeeper behind it: one publish counter per domain for all masters (no loss seen where
none happened, so no resync beyond the one at the gatekeeper's start), rules offers
relayed once, sharding by identifier, and the frame counts the docs give."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import zmq

from smockron.core.hashring import HashRing
from smockron.core.shards import owned, shard_of
from smockron.gatekeeper._control import RESYNC_ATTEMPTS
from smockron.gatekeeper._decider import DELAY
from smockron.gatekeeper._threaded import Gatekeeper
from smockron.master.relay import OFFER_EVERY_S, Counters, Offers
from smockron.wire.codec import MAX_FRAMES, encode_rules
from smockron.wire.fleet import SYNC_PREFIX
from tests.master.client import FakeGatekeeper, now_ms
from tests.master.test_router import metric_sum
from tests.support import Proc, free_ports, smockron_proc, wait_for

REPO = Path(__file__).parents[2]


def addr(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


class Setup:
    """Two masters and a router on free ports, as processes."""

    def __init__(self, tmp_path: Path, shard_by: str, rules: list[str]) -> None:
        ports = free_ports(9)
        self.acc, self.ctl, self.met = ports[0:2], ports[2:4], ports[4:6]
        self.racc, self.rctl, self.rmet = ports[6:9]
        self.tmp_path, self.shard_by, self.rules = tmp_path, shard_by, rules
        self.ring = HashRing([addr(p) for p in self.acc])
        self.masters: list[Proc] = []
        self.router: Proc | None = None

    def master_args(self, i: int) -> list[str]:
        args = [
            "master",
            "--accounting",
            addr(self.acc[i]),
            "--control",
            addr(self.ctl[i]),
            "--metrics",
            f"127.0.0.1:{self.met[i]}",
        ]
        for rule in self.rules:
            args += ["--rule", rule]
        if self.shard_by == "identifier":  # a fleet: each holds its half of the shards
            j = 1 - i
            args += ["--peer", f"{addr(self.acc[j])},{addr(self.ctl[j])}", "--replicas", "1"]
        return args

    @contextmanager
    def running(self) -> Iterator[Setup]:
        with ExitStack() as stack:
            for i in range(2):
                self.masters.append(
                    stack.enter_context(
                        smockron_proc(self.master_args(i), self.tmp_path / f"m{i}.log")
                    )
                )
            router = [
                "router",
                "--accounting",
                addr(self.racc),
                "--control",
                addr(self.rctl),
                "--metrics",
                f"127.0.0.1:{self.rmet}",
                "--shard-by",
                self.shard_by,
            ]
            for i in range(2):
                router += ["--master", f"{addr(self.acc[i])},{addr(self.ctl[i])}"]
            self.router = stack.enter_context(smockron_proc(router, self.tmp_path / "r.log"))
            stack.callback(lambda: [m.stop() for m in self.masters])  # restarted ones too
            yield self

    def restart(self, i: int) -> None:
        """Kill master ``i`` and start it again (an empty memory store)."""
        self.masters[i].stop(signal.SIGKILL)
        self.masters[i] = Proc(self.masters[i].args, self.tmp_path / f"m{i}-again.log")

    def resyncs(self, domain: str) -> list[int]:
        """Per master, its "resync of DOMAIN" log lines."""
        line = re.compile(rf"resync of {re.escape(domain)}[ :]")
        return [len(line.findall(m.log())) for m in self.masters]


def owned_domain(ring: HashRing, owner: str, prefix: str) -> str:
    return next(f"{prefix}{i}" for i in range(500) if ring.owner(f"{prefix}{i}") == owner)


@pytest.mark.parametrize("shard_by", ["domain", "identifier"])
def test_no_loss_seen_and_one_resync_per_start(tmp_path: Path, shard_by: str) -> None:
    """Traffic at twice the rule through the router, to two masters: the gatekeeper's
    loss count (the router's counter against what it received) stays at zero, exactly,
    and each master resyncs each domain only for the gatekeeper's start (and its one
    retry if the first answer was missed)."""
    setup = Setup(tmp_path, shard_by, [])
    if shard_by == "domain":  # one domain on each master
        domains = [owned_domain(setup.ring, addr(p), "api") for p in setup.acc]
    else:  # one domain, spread over both
        domains = ["api"]
    setup.rules = [f"{d}:10/s:3" for d in domains]
    idents = [b"user-%d" % i for i in range(8)]
    if shard_by == "identifier":  # four held by each master (ports, hence shards, vary)
        mine = owned(addr(setup.acc[0]), [addr(setup.acc[1])], 1)
        pool = [b"user-%d" % i for i in range(200)]
        idents = [i for i in pool if shard_of(i) in mine][:4]
        idents += [i for i in pool if shard_of(i) not in mine][:4]
    with setup.running():
        wait_for(lambda: all("accounting SUB on" in m.log() for m in setup.masters), 15)
        gk = Gatekeeper(addr(setup.racc), addr(setup.rctl), domains)
        try:
            names = [d.encode() for d in domains]
            wait_for(lambda: all(n in gk._controls[0].heartbeat for n in names), 15)
            start = {n: gk._controls[0].heartbeat[n] for n in names}
            delayed = 0
            end = time.monotonic() + 4.0
            while time.monotonic() < end:  # each identifier at 20/s: twice its rule
                for name in names:
                    for ident in idents:
                        if gk.decide(name, ident)[0] is DELAY:
                            delayed += 1
                            gk.release()
                time.sleep(0.05)
            time.sleep(1.0)  # the last verdicts arrive
            # a counter after the last verdict: it counts every one of them
            link = gk._controls[0]
            wait_for(
                lambda: all(
                    link.heartbeat[n][1] == link.received.get(n, 0)
                    and link.heartbeat[n][0] > start[n][0]
                    for n in names
                ),
                10,
            )
            assert delayed > 0
            assert gk.counters.control_lost == 0
            for n in names:
                published, got = link.heartbeat[n]
                assert got - start[n][1] > 0, "no DELAY_UNTIL reached the gatekeeper"
                # the router counted exactly what the gatekeeper received
                assert published - start[n][0] == got - start[n][1]
            # the start's RESYNC, asked again every 0.25 s until one is answered (a loaded
            # machine answers late, or takes the first answer to the router before the
            # gatekeeper's subscription to it): no storm, and each master answered at
            # most twice (below)
            asked = gk.resyncs_requested
            assert asked <= RESYNC_ATTEMPTS * len(domains), asked
            for domain in domains:
                counts = setup.resyncs(domain)
                assert all(c <= asked for c in counts), (counts, asked)
                assert all(c <= 2 for c in counts), counts
                assert sum(counts) >= 1, "the gatekeeper's start asked for no resync"
            if shard_by == "identifier":  # one domain's traffic on both masters
                key = 'smockron_master_messages_total{domain="api",status="accepted"}'
                per_master = [
                    metric_sum(m, "smockron_master_messages_total").get(key, 0) for m in setup.met
                ]
                assert all(v > 0 for v in per_master), per_master
            router_lost = metric_sum(setup.rmet, "smockron_router_control_lost_total")
            assert router_lost == {"smockron_router_control_lost_total": 0.0}
        finally:
            gk.close()
        assert setup.router is not None
        assert setup.router.stop(signal.SIGTERM) == 0
        assert "lost on the way from the masters 0" in setup.router.log()


def test_counter_is_the_routers_and_offers_are_relayed_once(tmp_path: Path) -> None:
    """A gatekeeper subscribed to everything hears one counter per domain (not one per
    master), never decreasing, and the rules offer about once a period, not twice."""
    setup = Setup(tmp_path, "domain", ["api:10/s:3", "probe:1/s:1"])
    with setup.running():
        with FakeGatekeeper(setup.racc, setup.rctl) as gk:
            gk.handshake()
            t = now_ms() + 1500
            for i in range(30):
                gk.accepted("api", b"u%d" % (i % 5), t)
            gk.expect_control(15)
            gk.published.clear()
            gk.offers.clear()
            time.sleep(4.5)
            gk.drain_control(0.2)
            counts = [n for d, n in gk.published if d == b"api"]
            offers = [o for o in gk.offers if o.domain == b"api"]
        assert len(counts) >= 3
        assert counts == sorted(counts), counts
        # each master offers every domain once a period: relayed, one per period
        heartbeats = len(counts)
        assert 3 <= len(offers) <= heartbeats + 1, (len(offers), heartbeats)
        assert setup.router is not None
        log = setup.router.log()
        assert "different rules" not in log


def test_master_restart_keeps_the_counter_growing(tmp_path: Path) -> None:
    """A master that restarts starts its own count again; the router's does not go back,
    and no loss is shown for it."""
    setup = Setup(tmp_path, "domain", ["probe:1/s:1"])
    dom = owned_domain(setup.ring, addr(setup.acc[0]), "api")
    setup.rules.append(f"{dom}:10/s:3")
    with setup.running():
        with FakeGatekeeper(setup.racc, setup.rctl) as gk:
            gk.handshake()
            for i in range(20):
                gk.accepted(dom, b"u%d" % (i % 4), now_ms() + 1500)
            before = len(gk.expect_control(16))
            wait_for(lambda: any(d == dom.encode() and n >= before for d, n in gk.published), 5)
            setup.restart(0)
            wait_for(lambda: "accounting SUB on" in setup.masters[0].log(), 15)
            gk.published.clear()
            gk.handshake()  # both ways up again through the router
            for i in range(20):
                gk.accepted(dom, b"v%d" % (i % 4), now_ms() + 1500)
            after = len(gk.expect_control(16))
            wait_for(
                lambda: any(d == dom.encode() and n >= before + after for d, n in gk.published), 5
            )
            counts = [n for d, n in gk.published if d == dom.encode()]
        assert counts == sorted(counts) and counts[0] >= before, counts
        assert setup.router is not None
        assert setup.router.stop(signal.SIGTERM) == 0
        assert "lost on the way from the masters 0" in setup.router.log()


def test_frame_counts_agree_with_the_docs(tmp_path: Path) -> None:
    """A message of ``MAX_FRAMES`` frames goes to the master (which counts it as
    malformed); one more frame and the router discards it whole and names its length.
    docs/master.md gives the same number."""
    setup = Setup(tmp_path, "domain", ["api:1/s:3", "probe:1/s:1"])
    owner = setup.acc.index(int(setup.ring.owner("api").rpartition(":")[2]))
    with setup.running(), FakeGatekeeper(setup.racc, setup.rctl) as gk:
        gk.handshake()
        gk.send([b"api\0", b"ACCEPTED", b"x", b"1", b""] + [b"z"] * (MAX_FRAMES - 5))
        gk.send([b"api\0", b"ACCEPTED", b"y", b"1", b""] + [b"z"] * (MAX_FRAMES - 4))
        key = 'smockron_master_malformed_total{reason="frame_count"}'
        wait_for(lambda: metric_sum(setup.met[owner], "smockron_master_malformed").get(key) == 1)
        router = setup.router
        assert router is not None
        wait_for(lambda: "discarded accounting message" in router.log())
        assert (
            f"discarded accounting message over {MAX_FRAMES} frames ({MAX_FRAMES + 1} frames)"
        ) in router.log()
        discarded = metric_sum(setup.rmet, "smockron_router_discarded_total")
        assert discarded == {"smockron_router_discarded_total": 1.0}
    guide = " ".join((REPO / "docs" / "master.md").read_text().split())
    assert f"frames past the {MAX_FRAMES}th" in guide
    assert f"more than {MAX_FRAMES} frames" in guide
    assert not re.search(r"\b16th\b", guide)


def test_identifier_sharding_discards_what_it_cannot_route(tmp_path: Path) -> None:
    """Sharding by identifier: a message without an identifier, or on the masters' own
    topics (a sync request), is discarded at the router, counted and logged; a RESYNC
    reaches every master."""
    setup = Setup(tmp_path, "identifier", ["api:1/s:3"])
    with setup.running(), FakeGatekeeper(setup.racc, setup.rctl) as gk:
        wait_for(lambda: all("accounting SUB on" in m.log() for m in setup.masters), 15)
        assert setup.router is not None
        router = setup.router
        wait_for(lambda: "router: accounting on" in router.log(), 15)  # bound (it starts last)
        wait_for(lambda: all("warm start:" in m.log() for m in setup.masters), 15)
        time.sleep(0.5)  # the router's subscription reaches the gatekeeper's PUB
        # a warm start asks again until its peer starts answering: it may be answered twice
        answered = [m.log().count("sync for a peer") for m in setup.masters]
        gk.send([b"api\0", b"ACCEPTED"])
        gk.send([b"\0smockron-sync\0abc", b"SYNC", b"\xff" * 8])
        wait_for(lambda: "on a topic of the masters' own" in router.log())
        wait_for(lambda: "without an identifier (2 frames)" in router.log())
        for _ in range(3):
            gk.send([b"api\0", b"RESYNC"])
            time.sleep(0.2)
        wait_for(lambda: all(c >= 1 for c in setup.resyncs("api")), 10)
        # the router did not pass the sync request on
        assert [m.log().count("sync for a peer") for m in setup.masters] == answered
        discarded = metric_sum(setup.rmet, "smockron_router_discarded_total")
        assert discarded == {"smockron_router_discarded_total": 2.0}
        # a restarted master's warm start: its peer's answer is not relayed
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        try:
            sub.subscribe(SYNC_PREFIX)
            sub.connect(addr(setup.rctl))
            time.sleep(0.3)
            before = setup.masters[1].log().count("sync for a peer")
            setup.restart(0)
            wait_for(lambda: setup.masters[1].log().count("sync for a peer") > before, 15)
            assert not sub.poll(500), sub.recv_multipart()
        finally:
            sub.close(0)
            ctx.term()


def test_counters_against_an_injected_order() -> None:
    """The router's counter: relayed plus lost upstream; a master's restart is no loss,
    and the counter never decreases."""
    c = Counters.of(2)
    api = b"api\0"
    c.heartbeat(0, api, 100, 0.0)  # baselines: what came before is not ours to judge
    c.heartbeat(1, api, 7, 0.0)
    assert c.count(api) == 0
    c.delivered(0, {api: 5})
    c.delivered(1, {api: 2})
    assert c.count(api) == 7  # counted as relayed, before either master's next counter
    assert c.heartbeat(0, api, 105, 1.0) == 0
    assert c.heartbeat(1, api, 12, 1.0) == 3  # it published 5, the router got 2
    assert c.count(api) == 10 and c.lost == 3
    assert c.heartbeat(0, api, 2, 2.0) == 0  # master 0 restarted: counting starts again
    c.delivered(0, {api: 4})
    assert c.heartbeat(0, api, 6, 3.0) == 0
    assert c.count(api) == 14
    assert c.current(3.0) == [(b"api", 14)]
    assert c.current(100.0) == []  # no master counts it any more: the router neither


def test_a_reconnected_master_counts_afresh() -> None:
    """A master whose connection came back starts a new baseline at its next counter,
    even one past its old count (a restarted master that published before the router's
    subscription reached it: the case counting by a lower count missed); what it lost
    before stays in the router's counter, which never decreases."""
    c = Counters.of(1)
    api = b"api\0"
    c.heartbeat(0, api, 0, 0.0)
    c.delivered(0, {api: 1})
    assert c.heartbeat(0, api, 2, 1.0) == 1
    assert c.count(api) == 2
    c.reconnected(0)  # it restarted, answered 4 requests, 3 before the router listened
    c.delivered(0, {api: 1})
    assert c.heartbeat(0, api, 4, 2.0) == 0  # a baseline, though 4 >= 2
    assert c.count(api) == 3 and c.lost == 1
    c.delivered(0, {api: 2})
    assert c.heartbeat(0, api, 7, 3.0) == 1  # counting goes on from the baseline
    assert c.count(api) == 6


def test_offers_deduplicated_by_content_and_time() -> None:
    offers = Offers()
    a = encode_rules("api", "history", ())
    b = encode_rules("api", "gcra", ())
    assert offers.fresh(a, 0, 0.0)
    assert not offers.fresh(a, 1, 0.3)  # the other master's copy
    assert not offers.fresh(a, 0, OFFER_EVERY_S - 0.01)
    assert offers.fresh(a, 1, OFFER_EVERY_S)
    assert offers.fresh(b, 0, OFFER_EVERY_S + 0.1)  # changed: at once, and two masters
    assert offers.disagree == 1  # disagreeing within a period is noticed


def test_shard_by_is_domain_or_identifier() -> None:
    from smockron.errors import ConfigError
    from smockron.master.router import MasterAddress, Router

    only = [MasterAddress.parse("tcp://127.0.0.1:1,tcp://127.0.0.1:2")]
    with pytest.raises(ConfigError, match="neither domain nor identifier"):
        Router("tcp://127.0.0.1:3", "tcp://127.0.0.1:4", only, shard_by="ip")
    router = Router("tcp://127.0.0.1:3", "tcp://127.0.0.1:4", only, shard_by="identifier")
    assert router.shard_by == "identifier"
    router.close()
