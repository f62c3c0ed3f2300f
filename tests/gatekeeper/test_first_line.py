"""The first line on an injected clock: exact admission times from the domain's rules."""

from __future__ import annotations

import pytest

from smockron.core.rules import Rule
from smockron.gatekeeper._decider import ACCEPT, DELAY, REJECT, Decider
from smockron.gatekeeper._firstline import Line, first_lines, line_admit

D = b"api"
T0 = 1_700_000_000_000


def decider(algorithm: str = "history", *rules: Rule, max_delay_ms: int = 5000) -> Decider:
    d = Decider(max_delay_ms=max_delay_ms, max_delayed=10_000)
    d.set_line(D, Line.of(algorithm, rules or (Rule(10.0, 20),)))
    return d


def burst(d: Decider, n: int, now: int = T0, ident: bytes = b"x") -> list[tuple[str, int]]:
    out = []
    for _ in range(n):
        decision = d.decide(D, ident, now)
        out.append((decision.verdict.value, decision.until_ms))
    return out


def test_a_burst_of_500_admits_the_burst_and_spaces_the_rest() -> None:
    d = decider()
    got = burst(d, 500)
    assert got[:20] == [("accept", 0)] * 20
    # then one every 100 ms, as long as the wait stays within 5 s; the rest is refused
    assert got[20:70] == [("delay", T0 + 100 * k) for k in range(1, 51)]
    assert {v for v, _ in got[70:]} == {"reject"}
    assert (d.counters.accepted, d.counters.delayed, d.counters.rejected) == (20, 50, 430)


def test_gcra_line_admits_burst_plus_one_as_the_gcra_master() -> None:
    got = burst(decider("gcra"), 30)
    assert [v for v, _ in got].count("accept") == 21


def test_a_polite_client_is_never_held() -> None:
    d = decider()
    for k in range(200):  # 9/s against 10/s
        assert d.decide(D, b"polite", T0 + k * 111).verdict is ACCEPT


def test_rejections_are_not_charged() -> None:
    d = decider(max_delay_ms=0)  # no waiting: over the line is a rejection
    assert [v for v, _ in burst(d, 25)].count("accept") == 20
    # 100 ms later exactly one more fits: the 5 rejections cost nothing
    assert [v for v, _ in burst(d, 3, T0 + 100)] == ["accept", "reject", "reject"]


def test_a_delay_until_means_the_allowance_is_used_up() -> None:
    """The master says T0+1000 for a client this gatekeeper never saw: one request at
    T0+1000, then one per interval, not a whole burst at T0+1000."""
    d = decider()
    assert d.control(D, b"x", T0 + 1000, T0)
    got = burst(d, 4, T0 + 10)
    assert got == [
        ("delay", T0 + 1000),
        ("delay", T0 + 1100),
        ("delay", T0 + 1200),
        ("delay", T0 + 1300),
    ]
    # and once that time has passed, the client is still held to the interval
    d2 = decider()
    d2.control(D, b"y", T0 + 1000, T0)
    assert [v for v, _ in burst(d2, 3, T0 + 1050, b"y")] == ["accept", "delay", "delay"]


def test_recheck_queues_waiting_requests_one_interval_apart() -> None:
    d = decider()
    burst(d, 20)
    first, second = d.decide(D, b"x", T0), d.decide(D, b"x", T0)
    assert (first.until_ms, second.until_ms) == (T0 + 100, T0 + 200)
    # meanwhile other gatekeepers' requests went: the master now says T0+600
    d.control(D, b"x", T0 + 600, T0 + 50)
    assert d.recheck(D, b"x", first, T0 + 100, held=False) == T0 + 600
    assert d.recheck(D, b"x", second, T0 + 200, held=False) == T0 + 700  # queued behind
    assert d.recheck(D, b"x", first, T0 + 600, held=True) == 0  # its slot: go
    assert d.recheck(D, b"x", second, T0 + 700, held=True) == 0
    # a new request queues after both
    assert d.decide(D, b"x", T0 + 700).until_ms == T0 + 800


def test_recheck_rejects_past_the_longest_delay_without_taking_a_slot() -> None:
    d = decider(max_delay_ms=1000)
    burst(d, 20)
    late = d.decide(D, b"x", T0)
    d.control(D, b"x", T0 + 5000, T0 + 1)
    assert d.recheck(D, b"x", late, T0 + 100, held=False) == -1
    assert d.counters.rejected_after_delay == 1
    assert d._next_free == {}  # nothing reserved for it


def test_several_rules_the_strictest_wins() -> None:
    # 10/s burst 5 and 2/s burst 8: 5 at once, then 10/s until the second rule's 8
    d = decider("history", Rule(10.0, 5), Rule(2.0, 8))
    got = burst(d, 9)
    assert [v for v, _ in got[:5]] == ["accept"] * 5
    assert [u - T0 for _, u in got[5:8]] == [100, 200, 300]
    assert got[8] == ("delay", T0 + 500)  # the 2/s rule: 8 within 3.5 s, then 500 ms apart


def test_line_admit_is_pure() -> None:
    line = Line.of("history", (Rule(1.0, 2), Rule(10.0, 1)))
    assert line is not None
    at, tats = line_admit(line, None, 0, T0)
    assert at == T0 and tats == (T0 + 1000.0, T0 + 100.0)
    at2, _ = line_admit(line, tats, 0, T0)
    assert at2 == T0 + 100  # the 10/s burst-1 rule


def test_changing_a_domains_rules_starts_afresh() -> None:
    d = decider()
    burst(d, 20)
    assert d.decide(D, b"x", T0).verdict is DELAY
    assert not d.set_line(D, Line.of("history", (Rule(10.0, 20),)))  # same: kept
    assert d.set_line(D, Line.of("history", (Rule(10.0, 40),)))
    assert d.decide(D, b"x", T0).verdict is ACCEPT
    assert d.set_line(D, None)
    assert burst(d, 100) == [("accept", 0)] * 100  # no line: only the master's word


def test_no_line_keeps_the_original_behaviour() -> None:
    d = Decider()
    assert burst(d, 500) == [("accept", 0)] * 500


def test_sweep_forgets_passed_times_and_the_table_is_bounded() -> None:
    d = Decider(max_entries=10)
    d.set_line(D, Line.of("history", (Rule(10.0, 2),)))
    for i in range(50):  # more identifiers than fit: the rest is simply not held
        assert d.decide(D, b"id-%d" % i, T0).verdict is ACCEPT
    assert len(d._single[D][2]) == 10
    assert d.sweep_local(T0 + 1000) == 10
    assert d._single[D][2] == {}


def test_first_lines_from_configuration() -> None:
    lines = first_lines(["api:10/s:20", "api:100/m:50", "web:1/s:1"])
    assert set(lines) == {b"api", b"web"}
    api = lines[b"api"]
    assert api is not None and api.intervals == (100.0, 600.0)
    gcra = first_lines({"api": ["gcra", "10/s:20"]})[b"api"]
    assert gcra is not None and gcra.tolerances == (2000.0,)
    assert first_lines({"api": [Rule(10.0, 20)]})[b"api"] == Line.of("history", (Rule(10.0, 20),))


@pytest.mark.parametrize("spec", ["api:ten/s:2", "api:10/s:0", "api"])
def test_bad_rule_configuration_is_refused(spec: str) -> None:
    from smockron.errors import RuleError

    with pytest.raises(RuleError):
        first_lines([spec])


def test_reject_verdict_value() -> None:
    d = decider(max_delay_ms=0)
    got = burst(d, 21)
    assert got[-1][0] == REJECT.value


def test_waiting_goes_at_its_time_without_a_first_line() -> None:
    from smockron.gatekeeper._decider import Waiting

    d = Decider()
    d.control(D, b"x", T0 + 500, T0)
    decision = d.decide(D, b"x", T0)
    assert decision.verdict is DELAY and not decision.paced
    d.control(D, b"x", T0 + 900, T0 + 100)  # a later verdict does not hold it back
    waiting = Waiting(d, D, b"x", decision)
    assert waiting.woke(T0 + 500) is None and not waiting.rejected


def test_waiting_rechecks_a_paced_delay_until_it_may_go() -> None:
    from smockron.gatekeeper._decider import Waiting

    d = decider()
    burst(d, 20)
    decision = d.decide(D, b"x", T0)
    assert decision.paced and decision.until_ms == T0 + 100
    waiting = Waiting(d, D, b"x", decision)
    d.control(D, b"x", T0 + 400, T0 + 50)  # others went meanwhile
    assert waiting.woke(T0 + 100) == T0 + 400
    assert waiting.woke(T0 + 400) is None
    assert (waiting.rejected, waiting.went_at) == (False, T0 + 400)
    late = Waiting(d, D, b"x", d.decide(D, b"x", T0 + 400))
    d.control(D, b"x", T0 + 60_000, T0 + 401)
    assert late.woke(T0 + 500) is None and late.rejected


def test_rules_offers_are_bounded_and_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever publishes on the control port cannot make a gatekeeper remember
    unbounded domains, nor install rules it cannot use."""
    from smockron.gatekeeper import Gatekeeper, _control
    from smockron.wire.codec import RULES, RULES_TOPIC, encode_rules

    monkeypatch.setattr(_control, "MAX_LINES", 3)
    gk = Gatekeeper(None, None, None)  # every domain, no sockets
    try:
        for i in range(10):
            gk._apply_control(encode_rules(f"d{i}", "history", (Rule(1.0, 1),)), T0)
        assert sorted(gk.decider.lines) == [b"d0", b"d1", b"d2"]
        gk._apply_control(encode_rules("d0", "history", (Rule(2.0, 2),)), T0)  # known: updated
        assert gk.decider.lines[b"d0"] == Line.of("history", (Rule(2.0, 2),))
        gk._apply_control([RULES_TOPIC, RULES, b"d1", b"history", b"inf 1"], T0)
        gk._apply_control(encode_rules("d2", "leaky", (Rule(1.0, 1),)), T0)
        assert gk.counters.control_malformed == 1 and gk.counters.rules_received == 13
        assert gk.decider.lines[b"d2"] == Line.of("history", (Rule(1.0, 1),))  # unchanged
    finally:
        gk.close()


def test_a_delay_woken_past_the_longest_delay_is_refused() -> None:
    """The longest delay is a promise: a request whose wait ends late (its loop or
    thread was busy at its time) is refused, paced or not, instead of going late."""
    from smockron.gatekeeper._decider import Waiting

    d = decider(max_delay_ms=1000)
    burst(d, 20)
    paced = d.decide(D, b"x", T0)
    assert paced.paced and paced.until_ms == T0 + 100
    on_time = Waiting(d, D, b"x", paced)
    assert on_time.woke(T0 + 100) is None and not on_time.rejected
    late = Waiting(d, D, b"x", paced)
    assert late.woke(T0 + 1001) is None and late.rejected
    plain = Decider(max_delay_ms=1000)
    plain.control(D, b"y", T0 + 1000, T0)
    unpaced = plain.decide(D, b"y", T0)
    assert unpaced.verdict is DELAY and not unpaced.paced
    assert Waiting(plain, D, b"y", unpaced).woke(T0 + 1000) is None  # at the limit: goes
    refused = Waiting(plain, D, b"y", unpaced)
    assert refused.woke(T0 + 1001) is None and refused.rejected
    assert (d.counters.rejected_after_delay, plain.counters.rejected_after_delay) == (1, 1)


async def test_a_gatekeeper_whose_loop_was_busy_refuses_the_late_request() -> None:
    """Through AsyncGatekeeper.wait_out: the loop is blocked past the request's longest
    delay while it sleeps; when it wakes, the request is refused, not let through."""
    import asyncio
    import time

    from smockron.gatekeeper import AsyncGatekeeper

    gk = AsyncGatekeeper(None, None, ["api"], rules=["api:10/s:1"], max_delay_ms=200)
    gk.start()
    try:
        assert gk.check(D, b"x").verdict is ACCEPT
        decision = gk.check(D, b"x")
        assert decision.verdict is DELAY and decision.paced
        waiting = asyncio.create_task(gk.wait_out(decision, D, b"x"))
        await asyncio.sleep(0)  # it sleeps until its slot...
        time.sleep(0.25)  # ...while the loop is busy past the longest delay
        assert await waiting is False
        assert gk.counters.rejected_after_delay == 1 and gk.decider.waiting == 0
    finally:
        await gk.aclose()
