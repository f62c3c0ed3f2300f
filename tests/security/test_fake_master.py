"""A gatekeeper pinning the master's key obeys no other process on the control port."""

from __future__ import annotations

import time
from typing import Any

import pytest
import zmq

from smockron.gatekeeper._decider import Verdict
from smockron.gatekeeper._threaded import Gatekeeper
from smockron.wire.codec import encode_control
from tests.security.conftest import Keys
from tests.security.peers import MasterSockets
from tests.support import free_ports


def now_ms() -> int:
    return int(time.time() * 1000)


def feed(master: MasterSockets, gk: Gatekeeper, seconds: float) -> None:
    """DELAY_UNTILs blocking ``victim`` for a minute, sent for ``seconds`` or until the
    gatekeeper takes one."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and gk.counters.control_received == 0:
        master.publish(encode_control("api", b"victim", now_ms() + 60_000))
        time.sleep(0.02)


@pytest.mark.parametrize("impostor", ["no keys", "its own keys"])
def test_a_fake_master_feeds_no_gatekeeper(
    keys: Keys, impostor: str, caplog: pytest.LogCaptureFixture
) -> None:
    acc, ctl = (f"tcp://127.0.0.1:{p}" for p in free_ports(2))
    gk = Gatekeeper(acc, ctl, ["api"], curve=keys.client("gk"), max_delay_ms=100)
    try:
        fake = MasterSockets(
            acc, ctl, None if impostor == "no keys" else keys.server("rogue-master")
        )
        try:
            feed(fake, gk, 1.5)  # several reconnections: each handshake fails
        finally:
            fake.close()
        assert gk.counters.control_received == 0
        assert not gk.control_connected and not gk.master_connected
        assert gk.decide(b"api", b"victim").verdict is Verdict.ACCEPT
        assert "cannot authenticate to the master" in caplog.text
        assert gk.stats()["handshakes_failed"] >= 2  # both sockets, each retried

        real = MasterSockets(acc, ctl, keys.server("master"))  # the pinned key, same ports
        try:
            feed(real, gk, 10)  # the gatekeeper's reconnection backoff is at most 2 s
            assert gk.counters.control_received >= 1 and gk.control_connected
            assert gk.decide(b"api", b"victim").verdict is Verdict.REJECT  # > max delay
        finally:
            real.close()
    finally:
        gk.close()


def test_the_middlewares_pass_the_keys_to_their_gatekeeper(keys: Keys) -> None:
    from smockron.gatekeeper.asgi import SmockronMiddleware
    from smockron.gatekeeper.wsgi import SmockronWSGIMiddleware

    acc, ctl = (f"tcp://127.0.0.1:{p}" for p in free_ports(2))
    curve = keys.client("gk")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        return None

    asgi = SmockronMiddleware(app, domain="api", accounting=acc, control=ctl, curve=curve)
    assert asgi.gatekeeper.curve is curve
    wsgi = SmockronWSGIMiddleware(
        lambda *a: [], domain="api", accounting=acc, control=ctl, curve=curve
    )
    try:
        assert wsgi.gatekeeper.curve is curve
        sub = wsgi.gatekeeper._control_socket()
        assert sub is not None and sub.getsockopt(zmq.MECHANISM) == zmq.CURVE
    finally:
        wsgi.close()
