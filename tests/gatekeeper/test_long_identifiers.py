"""An identifier longer than a master accepts is limited like any other: decided and
reported by its digest, the same on every gatekeeper (a real master on 127.0.0.1)."""

from __future__ import annotations

import functools
import time

from smockron.gatekeeper import Gatekeeper, HttpGate, RequestInfo, Verdict, header
from smockron.gatekeeper._decider import HASHED, MAX_IDENTIFIER, wire_identifier
from tests.master.running import running_master, settings
from tests.support import wait_for

TOKEN = b"Bearer " + b"t" * 1993  # 2,000 bytes, as a long bearer token


def test_the_digest_is_fixed_length_and_only_for_long_identifiers() -> None:
    assert wire_identifier(b"x" * MAX_IDENTIFIER) == b"x" * MAX_IDENTIFIER
    digest = wire_identifier(TOKEN)
    assert digest.startswith(HASHED) and len(digest) == len(HASHED) + 64
    assert wire_identifier(TOKEN) == digest and wire_identifier(digest) == digest
    assert wire_identifier(TOKEN[:1500]) != digest  # no truncation: distinct stay distinct


def test_http_identification_keeps_long_identifiers_whole() -> None:
    """The middlewares no longer cut identifiers: two tokens sharing their first
    kilobyte are two clients."""
    gate = HttpGate("api", identify=header("authorization"))
    one, two = TOKEN, TOKEN[:-1] + b"u"
    seen = [
        gate.resolve(RequestInfo("10.0.0.1", "GET", "/", {"authorization": t.decode()}.get))
        for t in (one, two)
    ]
    assert [target[1] if target else None for target in seen] == [one, two]


def test_a_long_identifier_is_held_to_its_rule_across_two_gatekeepers() -> None:
    """Each gatekeeper's first line admits the burst; the master must see both
    gatekeepers' requests as one client's to hold it to the rule. Before, it dropped the
    2,000-byte identifier as oversized and the client got the burst once per gatekeeper."""
    config = settings(api="1/h:3")
    with running_master(config) as master:
        gks = [
            Gatekeeper(
                config.accounting, config.control, ["api"], rules=["api:1/h:3"], max_delay_ms=100
            )
            for _ in range(2)
        ]
        try:
            for i, gk in enumerate(gks):  # both ways up, the master's subscription too
                wait_for(functools.partial(_heard, gk, b"probe-%d" % i), 10, 0.05)
            first, second = gks
            heard = second.counters.control_received
            verdicts = [first.decide(b"api", TOKEN).verdict for _ in range(3)]
            assert verdicts == [Verdict.ACCEPT] * 3
            # the master's DELAY_UNTIL for the client reaches the other gatekeeper (before,
            # it never came: give it time to, then count what the second one admits)
            deadline = time.monotonic() + 3
            while second.counters.control_received == heard and time.monotonic() < deadline:
                time.sleep(0.02)
            verdicts = [second.decide(b"api", TOKEN).verdict for _ in range(3)]
            assert verdicts == [Verdict.REJECT] * 3
            assert master.engine.stats.malformed["oversized"] == 0
        finally:
            for gk in gks:
                gk.close()


def _heard(gk: Gatekeeper, probe: bytes) -> bool:
    """One request of ``probe`` more; True once the master's verdict for it is back."""
    gk.decide(b"api", probe)
    return gk.counters.control_received > 0
