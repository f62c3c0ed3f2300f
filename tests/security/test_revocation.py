"""A key removed from ``--curve-clients`` takes effect at the SIGHUP: the revoked
gatekeeper's open connections are cut (its forged accounting is no longer charged, it
no longer hears the verdicts), while an allowed gatekeeper reconnects and is served."""

from __future__ import annotations

import logging
import time

import pytest
import zmq

from smockron.curve import AllowList
from smockron.wire.codec import ACCEPTED, encode_accounting
from tests.master.client import now_ms
from tests.security.conftest import Keys
from tests.security.peers import Peer, curve_settings, forged, on_loop, running_master
from tests.support import wait_for


def heard(peer: Peer, ident: bytes) -> bool:
    """A burst over the rule for ``ident``: its DELAY_UNTIL came back to ``peer``."""
    at = now_ms()
    peer.send([encode_accounting("api", ACCEPTED, ident, at) for _ in range(10)])
    return any(c.identifier == ident for c in peer.controls(0.1))


def test_a_revoked_key_is_cut_at_the_reload(keys: Keys, caplog: pytest.LogCaptureFixture) -> None:
    (keys.clients / "rogue.key").write_bytes(keys.public("rogue").read_bytes())
    settings = curve_settings(keys)
    acc, ctl = settings.accounting, settings.control
    with running_master(settings) as master:
        good = Peer(acc, ctl, keys.client("gk"))
        rogue = Peer(acc, ctl, keys.client("rogue"))
        try:
            wait_for(lambda: heard(good, b"probe-g"), 10, 0)
            wait_for(lambda: heard(rogue, b"probe-r"), 10, 0)
            api = master.stats.domains["api"]
            rogue.send(forged(b"victim"))
            wait_for(lambda: api.delayed == 20, 10)  # allowed, it is charged
            assert any(c.identifier == b"victim" for c in rogue.controls(0.3))  # and heard
            (keys.clients / "rogue.key").unlink()
            with caplog.at_level(logging.INFO, "smockron"):
                on_loop(master, master.reload)
            # the same connection, never closed by the rogue, is heard no more
            for _ in range(20):
                rogue.send(forged(b"victim"))
                time.sleep(0.05)
            assert not any(c.identifier == b"victim" for c in rogue.controls(0.3))
            # the allowed gatekeeper is back (its accounting charged, its verdicts sent)
            wait_for(lambda: heard(good, b"probe-g2"), 10, 0)
            assert api.delayed == 20
            assert master.stats.auth_denied >= 1  # the rogue's redial, refused
            assert "1 key(s) revoked" in caplog.text
        finally:
            good.close()
            rogue.close()


def test_adding_a_key_cuts_nobody(keys: Keys) -> None:
    """Only a removal cuts connections: a new key is let in at its handshake."""
    settings = curve_settings(keys)
    acc, ctl = settings.accounting, settings.control
    with running_master(settings) as master:
        good = Peer(acc, ctl, keys.client("gk"))
        try:
            wait_for(lambda: heard(good, b"probe"), 10, 0)
            accepted = master.monitor
            assert accepted is not None
            while accepted.poll(0):
                accepted.recv_multipart()
            (keys.clients / "rogue.key").write_bytes(keys.public("rogue").read_bytes())
            on_loop(master, master.reload)
            assert master.auth is not None and len(master.auth.keys) == 2
            assert heard(good, b"probe2")
            assert not accepted.poll(500)  # no new handshake: nobody was cut
        finally:
            good.close()


def test_an_empty_key_directory_is_warned_about(
    keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    (keys.clients / "gk.key").unlink()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    with caplog.at_level(logging.WARNING, "smockron.curve"):
        AllowList(ctx, keys.clients)
    ctx.term()
    assert "holds no public key (*.key): every gatekeeper will be refused" in caplog.text
