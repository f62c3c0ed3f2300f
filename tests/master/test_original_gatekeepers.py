"""A real master against gatekeepers that behave as the original ones do: they subscribe
to ``domain\\0``, know only DELAY_UNTIL, and queue accounting while the master is away."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import zmq

from smockron.wire.codec import (
    ACCEPTED,
    RULES_TOPIC,
    decode_control,
    decode_rules,
    encode_accounting,
)
from tests.master.client import FakeGatekeeper, now_ms
from tests.master.test_master_e2e import master_args
from tests.support import free_ports, smockron_proc, wait_for


class OriginalGatekeeper:
    """Raw pyzmq sockets, as the Node middleware and the nginx module use them."""

    def __init__(self, acc: int, ctl: int, domain: bytes = b"api") -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)  # no monitor: it queues while disconnected
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.connect(f"tcp://127.0.0.1:{acc}")
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.subscribe(domain + b"\0")
        self.sub.connect(f"tcp://127.0.0.1:{ctl}")
        self.domain = domain.decode()
        self.received: list[list[bytes]] = []

    def accepted(self, ident: bytes, ts: int | None = None) -> None:
        self.pub.send_multipart(
            encode_accounting(self.domain, ACCEPTED, ident, now_ms() if ts is None else ts)
        )

    def read(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self.sub.poll(int(left * 1000) + 1):
                self.received.append(self.sub.recv_multipart())

    def delays_for(self, ident: bytes) -> list[int]:
        return [c.until_ms for c in map(decode_control, self.received) if c.identifier == ident]

    def close(self) -> None:
        self.pub.close()
        self.sub.close()
        self.ctx.term()


def test_an_original_gatekeeper_sees_only_delay_until(tmp_path: Path) -> None:
    """The rules offer never reaches a ``domain\\0`` subscription: every control message
    an original gatekeeper gets parses as DELAY_UNTIL. One subscribed to everything sees
    the offer under a topic no domain can have."""
    acc, ctl = free_ports(2)
    args = master_args(acc, ctl, "--rule", "api:1/s:2", "--rule", "probe:1/s:1")
    with smockron_proc(args, tmp_path / "m.log"), FakeGatekeeper(acc, ctl) as everything:
        everything.handshake()
        original = OriginalGatekeeper(acc, ctl)
        try:
            time.sleep(0.3)  # its subscription reaches the master
            for _ in range(5):
                original.accepted(b"abuser")
            original.read(2.5)  # more than two rule offers go by meanwhile
            assert original.received, "no DELAY_UNTIL reached the original gatekeeper"
            for frames in original.received:
                assert frames[0] == b"api\0" and frames[1] == b"DELAY_UNTIL"
                decode_control(frames)
        finally:
            original.close()
        everything.drain_control(1.2)
        offers = {o.domain: o for o in everything.offers}
        assert set(offers) == {b"api", b"probe"}
        assert offers[b"api"].algorithm == "history"
        assert [str(r) for r in offers[b"api"].rules] == ["1/s:2"]
        frames = [RULES_TOPIC, b"RULES", b"api", b"history", b"1.0 2"]
        assert decode_rules(frames) == offers[b"api"]
        assert RULES_TOPIC.startswith(b"\0")  # never "<non-empty domain>\0..."


@pytest.mark.parametrize("algorithm", ["history", "gcra"])
def test_accounting_queued_during_an_outage_is_not_charged(tmp_path: Path, algorithm: str) -> None:
    """A polite client at half its rate behind an original gatekeeper that queues its
    accounting while the master is down: after the restart the backlog arrives at once,
    and it must not throttle the client (the master counts it as late)."""
    acc, ctl = free_ports(2)
    args = master_args(
        acc,
        ctl,
        "--rule",
        "api:10/s:10",
        "--algorithm",
        f"api={algorithm}",
        "--rule",
        "probe:1/s:1",
    )
    gk = OriginalGatekeeper(acc, ctl)
    try:
        with smockron_proc(args, tmp_path / "m1.log") as first:
            with FakeGatekeeper(acc, ctl) as fake:
                fake.handshake()

            def polite(seconds: float) -> None:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    gk.accepted(b"polite")
                    gk.read(0.2)  # 5/s: half the rule

            polite(1.0)
            first.kill()
        polite(4.0)  # queued in the gatekeeper's PUB meanwhile
        with smockron_proc(args, tmp_path / "m2.log") as second:
            polite(3.0)
            wait_for(lambda: " late=" in second.log() and " late=0 " not in second.log(), 5)
    finally:
        gk.close()
    assert gk.delays_for(b"polite") == []
