"""A fleet of two real ``smockron master`` processes and two gatekeepers following both:
each master SIGKILLed and restarted in turn (the next kill once the restarted one is
ready) under an abuser's bursts; the abuser is held to its rule over the whole window, a
polite client is never slowed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from smockron.gatekeeper import Gatekeeper, Verdict
from tests.support import Proc, RollingKills, free_ports, run_smockron, stopping, wait_for

RATE, BURST = 20.0, 20
RULE = f"api:{int(RATE)}/s:{BURST}"


def _master(me: tuple[str, str], peer: tuple[str, str], log: Path) -> Proc:
    return run_smockron(
        [
            "master",
            "--accounting",
            me[0],
            "--control",
            me[1],
            "--peer",
            ",".join(peer),
            "--rule",
            RULE,
            "--stats-interval",
            "0",
        ],
        log,
    )


def _ready(gk: Gatekeeper) -> bool:
    """Both masters' control and accounting connections count, and the rules came."""
    counted = gk._peers == len(gk.masters)
    return all(c.up > 0 for c in gk._controls) and counted and bool(gk.decider.lines)


def _links(gk: Gatekeeper) -> str:
    """A gatekeeper's view of its masters, for a failure's message."""
    controls = [c.up for c in gk._controls]
    return f"accounting counted {gk._peers} up {gk._acc_up}, control up {controls}"


@pytest.mark.slow
def test_each_master_killed_in_turn_holds_the_abuser_to_its_rule(tmp_path: Path) -> None:
    ports = free_ports(4)
    a = (f"tcp://127.0.0.1:{ports[0]}", f"tcp://127.0.0.1:{ports[1]}")
    b = (f"tcp://127.0.0.1:{ports[2]}", f"tcp://127.0.0.1:{ports[3]}")
    with stopping([]) as procs:
        procs += [_master(a, b, tmp_path / "a1.log"), _master(b, a, tmp_path / "b1.log")]
        gks = [Gatekeeper(None, None, ["api"], masters=[a, b], max_delay_ms=0) for _ in range(2)]
        try:
            try:
                wait_for(lambda: all(map(_ready, gks)), 15)
            except AssertionError as exc:
                raise AssertionError(f"not ready: {[_links(g) for g in gks]}") from exc
            admitted = polite_slowed = 0

            def restart(which: int) -> Proc:
                me, peer = (a, b) if which == 0 else (b, a)
                return _master(me, peer, tmp_path / f"{'ab'[which]}{time.monotonic_ns()}.log")

            kills = RollingKills(procs, restart)
            start = time.monotonic()
            for tick in range(48):  # 12 s: a burst of 20 every 250 ms, split over both
                kills.at(tick)
                for i in range(20):
                    verdict = gks[i % 2].decide(b"api", b"abuser").verdict
                    admitted += verdict is Verdict.ACCEPT
                polite = gks[tick % 2].decide(b"api", b"polite").verdict
                polite_slowed += polite is not Verdict.ACCEPT
                time.sleep(max(0.0, start + (tick + 1) * 0.25 - time.monotonic()))
            window = time.monotonic() - start
            assert kills.done, f"a restarted master was not ready in time: {kills.steps}"
        finally:
            for gk in gks:
                gk.close()
        assert "warm start: " in procs[0].log() and "warm start: " in procs[1].log()
    allowed = BURST + RATE * window
    assert polite_slowed == 0
    print(f"admitted {admitted} of {allowed:.0f} allowed")
    assert admitted <= 1.05 * allowed, (admitted, allowed)
    assert admitted >= 0.8 * allowed  # held to the rule, not shut out
