"""Master, two proxies and a backend as real processes; the master dies and comes back."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import httpx

from tests.gatekeeper.backend import backend
from tests.gatekeeper.commands import proxy_args
from tests.support import free_ports, master_args, run_smockron, stopping, wait_port

RULE = "e2e:5/s:5"


def burst(clients: list[httpx.Client], who: str, n: int) -> Counter[str]:
    """``n`` back-to-back requests alternating over the proxies; decisions counted."""
    seen: Counter[str] = Counter()
    for i in range(n):
        r = clients[i % len(clients)].get("/", headers={"x-client": who})
        assert r.status_code in (200, 503), r.text
        seen[r.headers.get("x-smockron-decision", "none")] += 1
    return seen


def until_enforced(clients: list[httpx.Client], who: str, timeout: float = 20) -> Counter[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = burst(clients, who, 20)
        if seen["reject"] or seen["delay"]:
            return seen
        time.sleep(0.2)
    raise AssertionError(f"no enforcement within {timeout}s")


def test_master_dies_and_returns(tmp_path: Path) -> None:
    acc, ctl, p1, p2 = free_ports(4)
    with backend() as (up, seen_by_backend):
        master = run_smockron(master_args(acc, ctl, rules=[RULE]), tmp_path / "master.log")
        zmq = (f"tcp://127.0.0.1:{acc}", f"tcp://127.0.0.1:{ctl}")
        proxies = [
            run_smockron(
                proxy_args(p, up, *zmq, "--decision-header", domain="e2e", max_delay="500ms"),
                tmp_path / f"proxy{p}.log",
            )
            for p in (p1, p2)
        ]
        procs = [master, *proxies]
        with (
            stopping(procs),
            httpx.Client(base_url=f"http://127.0.0.1:{p1}", timeout=10) as c1,
            httpx.Client(base_url=f"http://127.0.0.1:{p2}", timeout=10) as c2,
        ):
            wait_port(p1)
            wait_port(p2)
            clients = [c1, c2]
            # the rule is enforced across both gatekeepers
            first = until_enforced(clients, "abuser")
            assert first["accept"] >= 1

            master.kill()
            time.sleep(1.5)  # every DELAY_UNTIL given expires: <= max delay 0.5 s + 1 interval
            before = len(seen_by_backend.arrivals)
            started = time.monotonic()
            flowing = burst(clients, "abuser", 60)
            elapsed = time.monotonic() - started
            # Without their master the proxies keep serving: every request is answered,
            # and what each admits is held to the rule it learned (5/s burst 5) by its
            # first line, on its own traffic.
            assert sum(flowing.values()) == 60, flowing
            through = len(seen_by_backend.arrivals) - before
            assert through == flowing["accept"] + flowing["delay"]
            assert 5 <= through <= 2 * (5 + 5 * elapsed) + 2, (through, elapsed, flowing)
            assert burst(clients, "newcomer", 4) == Counter({"accept": 4})
            assert all(p.alive() for p in proxies)

            master = run_smockron(master_args(acc, ctl, rules=[RULE]), tmp_path / "master2.log")
            procs.append(master)
            wait_port(acc)
            again = until_enforced(clients, "abuser")
            assert again["reject"] + again["delay"] >= 1
            polite = burst(clients, "polite", 4)  # within burst: untouched
            assert polite == Counter({"accept": 4})
