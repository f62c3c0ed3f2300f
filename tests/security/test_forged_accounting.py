"""A publisher without an allowed key injects nothing: its DELAYED messages reach no
engine, while the same messages from an allowed gatekeeper do."""

from __future__ import annotations

import time

import pytest

from smockron.wire.codec import ACCEPTED, encode_accounting
from tests.master.client import now_ms
from tests.security.conftest import Keys
from tests.security.peers import Peer, curve_settings, forged, running_master
from tests.support import wait_for


def test_forged_accounting_without_an_allowed_key_reaches_no_engine(
    keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    settings = curve_settings(keys)
    acc, ctl = settings.accounting, settings.control
    with running_master(settings) as master:
        allowed = Peer(acc, ctl, keys.client("gk"))
        rogue = Peer(acc, ctl, keys.client("rogue"))  # the right master, an unknown key
        plain = Peer(acc, ctl, None)  # the original protocol, no CURVE at all
        try:
            deadline = time.monotonic() + 10
            while master.stats.auth_denied < 2 and time.monotonic() < deadline:
                rogue.send(forged(b"victim"))
                plain.send(forged(b"victim"))
                time.sleep(0.05)
            assert master.stats.auth_denied >= 2  # the rogue's two sockets, refused by ZAP
            # the allowed gatekeeper is heard: a probe comes back as a DELAY_UNTIL
            wait_for(lambda: _probe(allowed), 10, 0)
            rogue.send(forged(b"victim"))
            plain.send(forged(b"victim"))
            time.sleep(0.3)
            allowed.send([encode_accounting("api", ACCEPTED, b"victim", now_ms())])
            assert [c for c in allowed.controls(0.5) if c.identifier == b"victim"] == []
            api = master.stats.domains["api"]
            assert api.delayed == 0 and api.accepted >= 1
            # the same forged messages from the allowed key are charged
            allowed.send(forged(b"victim"))
            got = [c for c in allowed.controls(0.5) if c.identifier == b"victim"]
            assert got and got[-1].until_ms > now_ms() + 30_000
            assert master.stats.domains["api"].delayed == 20
            denials = [
                r.getMessage() for r in caplog.records if "handshake denied" in r.getMessage()
            ]
            rogue_key = keys.client("rogue").keypair.public.decode()
            assert denials and all(rogue_key in line and "127.0.0.1" in line for line in denials)
            assert len(denials) <= 5  # rate-limited, however often the rogue retries
        finally:
            for peer in (allowed, rogue, plain):
                peer.close()


def _probe(peer: Peer) -> bool:
    """One burst over the rule for a probe identifier: a DELAY_UNTIL for it came back."""
    at = now_ms()
    peer.send([encode_accounting("api", ACCEPTED, b"probe", at) for _ in range(10)])
    return any(c.identifier == b"probe" for c in peer.controls(0.1))
