"""``smockron router`` in front of two real masters: sharding by domain, control relayed."""

from __future__ import annotations

import signal
import urllib.request
from pathlib import Path

import pytest

from smockron.core.hashring import HashRing
from smockron.errors import ConfigError
from smockron.master.router import MasterAddress, Router
from tests.master.client import FakeGatekeeper, now_ms
from tests.support import free_ports, master_args, router_args, smockron_proc, wait_for


def metric_sum(port: int, prefix: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    return {
        name: float(v)
        for name, _, v in (line.rpartition(" ") for line in lines if line.startswith(prefix))
    }


def pick(ring: HashRing, owner: str, count: int, prefix: str) -> list[str]:
    """The first ``count`` domains named PREFIXn that ``owner`` owns."""
    found = [f"{prefix}{i}" for i in range(200) if ring.owner(f"{prefix}{i}") == owner]
    return found[:count]


def test_router_shards_by_domain_and_relays_control(tmp_path: Path) -> None:
    acc1, ctl1, met1, acc2, ctl2, met2, racc, rctl = free_ports(8)
    m1, m2 = f"tcp://127.0.0.1:{acc1}", f"tcp://127.0.0.1:{acc2}"
    ring = HashRing([m1, m2])
    doms1, doms2 = pick(ring, m1, 3, "dom"), pick(ring, m2, 3, "dom")
    probe1, probe2 = pick(ring, m1, 1, "probe")[0], pick(ring, m2, 1, "probe")[0]
    rules = [f"{d}:2/s:3" for d in [*doms1, *doms2]] + [f"{d}:1/s:1" for d in (probe1, probe2)]

    router = router_args(racc, rctl, (acc1, ctl1), (acc2, ctl2))
    with (
        smockron_proc(master_args(acc1, ctl1, rules=rules, metrics=met1), tmp_path / "m1.log"),
        smockron_proc(master_args(acc2, ctl2, rules=rules, metrics=met2), tmp_path / "m2.log"),
        smockron_proc(router, tmp_path / "router.log") as rproc,
        FakeGatekeeper(racc, rctl) as gk,
    ):
        gk.handshake(probe1)
        gk.handshake(probe2)
        t = now_ms() + 1500
        for d in [*doms1, *doms2]:
            for _ in range(3):
                gk.accepted(d, b"client", t)
        got = gk.expect_control(6)
        assert sorted((c.domain.decode(), c.until_ms) for c in got) == sorted(
            (d, t + 500) for d in [*doms1, *doms2]
        )
        key = 'smockron_master_messages_total{{domain="{}",status="accepted"}}'
        for met, own, other in ((met1, doms1, doms2), (met2, doms2, doms1)):
            values = metric_sum(met, "smockron_master_messages_total")
            assert all(values[key.format(d)] == 3 for d in own)
            assert all(values[key.format(d)] == 0 for d in other)
        assert rproc.stop(signal.SIGTERM) == 0
        wait_for(lambda: "router stopped: forwarded" in rproc.log())


def test_router_config_errors() -> None:
    with pytest.raises(ConfigError, match="ACC_ADDR,CTL_ADDR"):
        MasterAddress.parse("tcp://x:1")
    with pytest.raises(ConfigError, match="at least one"):
        Router("tcp://127.0.0.1:1", "tcp://127.0.0.1:2", [])
    dup = MasterAddress.parse("tcp://a:1,tcp://a:2")
    with pytest.raises(ConfigError, match="duplicate"):
        Router("tcp://127.0.0.1:1", "tcp://127.0.0.1:2", [dup, dup])


def test_ring_spreads_similar_domains() -> None:
    ring = HashRing(["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"])
    owners = [ring.owner(f"api{i}") for i in range(400)]
    assert 120 < owners.count("tcp://127.0.0.1:1") < 280
    assert ring.owner(b"api") == ring.owner("api")


def test_router_survives_garbage_and_oversized_frames(tmp_path: Path) -> None:
    """A hostile gatekeeper's huge frames and domain-less messages do not disturb the
    traffic of another gatekeeper on the same router; the rest of its garbage reaches the
    domain's master, which counts it as malformed."""
    acc, ctl, met, racc, rctl = free_ports(5)
    master = master_args(acc, ctl, rules=["api:1/s:3", "probe:1/s:1"], metrics=met)
    router = router_args(racc, rctl, (acc, ctl))
    with (
        smockron_proc(master, tmp_path / "master.log"),
        smockron_proc(router, tmp_path / "router.log") as rproc,
        FakeGatekeeper(racc, rctl) as good,
        FakeGatekeeper(racc, rctl) as hostile,
    ):
        good.handshake()
        hostile.handshake()
        t = now_ms() + 1500  # ahead of the master's clock (within tolerance): exact results
        huge = [b"api\0", b"ACCEPTED", b"x" * 200_000, b"1", b""]
        for i in range(20):
            if i < 10:
                hostile.send([b"", b"ACCEPTED", b"x", b"1", b""])
                hostile.send([b"api", b"ACCEPTED", b"x", b"1", b""])
                if i == 0:  # more frames than any message: the router drops it, whole
                    hostile.send([b"api\0", b"ACCEPTED", b"y", b"1", b""] + [b"z"] * 95)
            else:  # the router drops the hostile connection, never the master's
                hostile.send(huge)
            for _ in range(3):
                good.accepted("api", b"user-%d" % i, t)
        got = good.expect_control(20)
        assert sorted((c.identifier, c.until_ms) for c in got) == sorted(
            (b"user-%d" % i, t + 1000) for i in range(20)
        )
        # control is relayed to every gatekeeper, the one cut off for its huge frames too
        assert sorted(c.identifier for c in hostile.expect_control(20)) == sorted(
            c.identifier for c in got
        )
        wait_for(
            lambda: (
                metric_sum(met, "smockron_master_malformed_total").get(
                    'smockron_master_malformed_total{reason="domain_nul"}'
                )
                == 10
            )
        )
        m = metric_sum(met, "smockron_master_")
        assert m['smockron_master_messages_total{domain="api",status="accepted"}'] == 60
        assert sum(v for k, v in m.items() if k.startswith("smockron_master_malformed_total")) == 10
        wait_for(lambda: "discarded accounting message without a domain" in rproc.log())
        assert "discarded accounting message over 68 frames (100 frames)" in rproc.log()
        assert rproc.stop(signal.SIGTERM) == 0
        assert "discarded 11" in rproc.log()
