"""smockron's nginx module in a real nginx, with a real master and backend."""

from __future__ import annotations

import functools
import itertools
import signal
import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.nginx.servers import Gate, front, gate, nginx, require_module
from tests.support import master_args, run_smockron, wait_for

pytestmark = pytest.mark.usefixtures("built")


@pytest.fixture(scope="module")
def built() -> None:
    require_module()


def decide(client: httpx.Client, who: str) -> str:
    r = client.get("/", headers={"x-client": who})
    assert r.status_code in (200, 503), r.text
    if r.status_code == 503:
        assert int(r.headers["retry-after"]) >= 1
        assert r.headers["cache-control"] == "no-store"
        assert r.text.startswith("503 Service Unavailable: rate limited")
    return str(r.headers.get("x-smockron-decision", "none"))


def decisions(client: httpx.Client, who: str, n: int) -> Counter[str]:
    return Counter(decide(client, who) for _ in range(n))


def concurrent(port: int, who: str, n: int) -> Counter[str]:
    """``n`` requests at once, each on its own connection."""

    def one(_: int) -> str:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            return decide(client, who)

    with ThreadPoolExecutor(n) as pool:
        return Counter(pool.map(one, range(n)))


def all_at_once(port: int, who: str, n: int) -> Counter[str]:
    """``n`` requests sent together: every connection opened first, then every request
    written in one loop (threads starting one by one spread a burst over a second)."""
    request = f"GET / HTTP/1.1\r\nHost: x\r\nX-Client: {who}\r\nConnection: close\r\n\r\n"
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]

    def answer(sock: socket.socket) -> str:
        with sock:
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        for line in data.decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            if name.lower() == "x-smockron-decision":
                return value.strip()
        return "none"

    for sock in socks:
        sock.sendall(request.encode())
    with ThreadPoolExecutor(n) as pool:
        return Counter(pool.map(answer, socks))


@pytest.mark.slow  # asserts elapsed wall-clock time
def test_abuser_held_to_the_rule_polite_client_untouched(tmp_path: Path) -> None:
    with gate(tmp_path, location="smockron_max_delay 500ms;") as g:
        wait_for(lambda: g.stats()["master_connected"] == 1 and g.stats()["control_connected"] == 1)
        # a burst at once: the rule's burst goes, what fits in 500 ms waits, the rest is
        # rejected; the first line (the master's rules offer) holds it from the first
        # request
        started = time.monotonic()
        burst = concurrent(g.port, "abuser", 30)
        # (the threads start over some time: each 200 ms of it lets one more go)
        assert burst["accept"] >= 5 and burst["delay"] >= 1, burst
        assert burst["reject"] >= 10, burst
        # then one after the other: each waits its turn
        paced = decisions(g.client, "abuser", 10)
        elapsed = time.monotonic() - started
        assert paced["delay"] >= 9, paced
        passed = sum(1 for _t, who in g.seen.arrivals if who == "abuser")
        assert passed == burst["accept"] + burst["delay"] + 10
        assert passed <= 5 + 5 * elapsed + 1, (passed, elapsed)
        polite: Counter[str] = Counter()
        for _ in range(6):
            polite += decisions(g.client, "polite", 1)
            time.sleep(0.3)
        assert polite == {"accept": 6}, polite
        counters = g.stats()
        assert counters["rules_received_total"] >= 1
        assert counters["accounting_sent_total"] >= 5 + burst["delay"] + 10
        assert g.nginx.alive()


@pytest.mark.slow  # asserts wall-clock windows
def test_a_big_burst_reaches_the_backend_as_the_rule_allows(tmp_path: Path) -> None:
    """A burst far beyond the rule's: the backend sees the burst, then one request an
    interval; no half interval ever holds more than the burst (bench/accuracy.py's
    burst500, small)."""
    with gate(tmp_path, location="smockron_max_delay 1s;") as g:
        wait_for(lambda: g.stats()["rules_received_total"] >= 1)
        burst = all_at_once(g.port, "burst", 60)
        with g.seen.lock:
            times = sorted(t for t, who in g.seen.arrivals if who == "burst")
        assert burst["accept"] == 5 and 1 <= burst["delay"] <= 5, burst
        assert len(times) == burst["accept"] + burst["delay"]
        # the most arrivals in any 100 ms (half the rule's interval)
        most = max(sum(1 for u in times if t <= u <= t + 0.1) for t in times)
        assert most <= 5, [round(t - times[0], 3) for t in times]
        # the delayed ones an interval apart (a busy machine may make it a little less)
        gaps = [b - a for a, b in itertools.pairwise(times[4:])]
        assert all(gap >= 0.15 for gap in gaps), gaps


@pytest.mark.slow  # asserts elapsed wall-clock time
def test_master_gone_fails_open(tmp_path: Path) -> None:
    with gate(tmp_path, location="smockron_max_delay 500ms;") as g:
        client = g.client
        wait_for(lambda: g.stats()["control_connected"] == 1)
        wait_for(lambda: g.stats()["rules_received_total"] >= 1)
        g.master.kill()
        wait_for(lambda: g.stats()["master_connected"] == 0)
        wait_for(lambda: g.stats()["control_connected"] == 0)
        # polite clients notice nothing; an abuser is held by the first line alone
        for i in range(5):
            assert decide(client, f"polite{i}") == "accept"
        started = time.monotonic()
        abuser = decisions(client, "abuser", 15)
        elapsed = time.monotonic() - started
        # the burst, then one each 200 ms (a client slower than that between two
        # requests is accepted, on a busy machine): 15 take at least 10 intervals
        assert abuser["accept"] + abuser["delay"] == 15 and abuser["delay"] >= 1, abuser
        assert elapsed >= (15 - 5) / 5 - 0.05, elapsed
        assert g.stats()["accounting_dropped_total"] >= 20
        before = len(g.seen.arrivals)
        assert decide(client, "polite0") == "accept"
        assert len(g.seen.arrivals) == before + 1


@pytest.mark.parametrize(
    ("directive", "error"),
    [
        ("smockron_rule api:10/x:5;", "unknown time unit"),
        ("smockron_rule api:10/s;", "expects DOMAIN:RATE/UNIT:BURST"),
        ("smockron_rule api:10/s:0;", "bad burst"),
        ("smockron_algorithm api=fifo;", "unknown"),
        ("smockron_reject_sample 2;", "from 0 to 1"),
        ("smockron_master tcp://127.0.0.1:1;", "second master"),
        ("smockron_server tcp://127.0.0.1:1;", "second master"),
        ("smockron_curve_secret /nonexistent.key_secret;", "nonexistent"),
    ],
)
def test_bad_directives_fail_the_config_test(tmp_path: Path, directive: str, error: str) -> None:
    with (
        pytest.raises(AssertionError, match=error),
        nginx(tmp_path, port=1, upstream=1, acc=2, ctl=3, http=directive),
    ):
        pass


@pytest.mark.slow  # asserts elapsed wall-clock time
def test_workers_share_the_zone(tmp_path: Path) -> None:
    """Verdicts and first-line times are the zone's: a client whose connections land on
    different workers is held as one, and worker 0's control reaches them all."""
    with gate(tmp_path, workers=2) as g:
        wait_for(lambda: g.stats()["rules_received_total"] >= 1)
        workers: set[str] = set()
        got = []
        started = time.monotonic()
        for _ in range(12):  # a new connection each: either worker
            with httpx.Client(base_url=f"http://127.0.0.1:{g.port}", timeout=10) as one:
                r = one.get("/", headers={"x-client": "shared"})
                workers.add(r.headers["x-worker"])
                got.append(r.headers["x-smockron-decision"])
        elapsed = time.monotonic() - started
        assert len(workers) == 2, workers
        # held as one client: the burst, then one each 200 ms (a client slower than that
        # between two requests is accepted, on a busy machine)
        assert got[:5] == ["accept"] * 5 and "delay" in got, got
        assert got.count("accept") <= 5 + 5 * elapsed - got.count("delay") + 1, got


def test_reload_keeps_the_verdicts_and_reconnects(tmp_path: Path) -> None:
    """SIGHUP: new workers on the same zone; the new worker 0 follows control again."""
    error_log = tmp_path / "nginx" / "error.log"
    with gate(tmp_path) as g:
        wait_for(lambda: g.stats()["rules_received_total"] >= 1)
        assert decisions(g.client, "abuser", 6)["delay"] >= 1
        received = g.stats()["control_received_total"]
        assert received >= 1
        g.nginx.popen.send_signal(signal.SIGHUP)
        wait_for(lambda: "reconfiguring" in error_log.read_text())
        wait_for(lambda: error_log.read_text().count("control connected") >= 2)
        # the zone lived on: the abuser's entry is still there
        assert g.stats()["delay_entries"] >= 1
        assert decide(g.client, "polite") == "accept"
        assert g.stats()["control_received_total"] >= received


def test_restarted_nginx_gets_the_verdicts_back(tmp_path: Path) -> None:
    """A new nginx asks the real master for the live verdicts (RESYNC, privately answered)
    before the client's next request: the abuser is still held, not given a new burst."""
    with gate(tmp_path, rules=["api:1/m:2"]) as first:
        wait_for(lambda: first.stats()["master_connected"] == 1)
        wait_for(lambda: first.stats()["rules_received_total"] >= 1)
        assert decisions(first.client, "abuser", 3) == {"accept": 2, "reject": 1}
        wait_for(lambda: first.stats()["control_received_total"] >= 1)
        first.nginx.stop()
        with front(tmp_path / "second", acc=first.acc, ctl=first.ctl) as second:
            wait_for(lambda: second.stats()["master_connected"] == 1)
            wait_for(lambda: second.stats()["control_received_total"] >= 1)
            assert decide(second.client, "abuser") == "reject"
            assert decide(second.client, "polite") == "accept"
        assert "resync of api" in first.master.log()


def sent_at_least(g: Gate, n: int) -> bool:
    return g.stats()["accounting_sent_total"] >= n


def test_restarted_master_hears_the_accounting_again(tmp_path: Path) -> None:
    """The master restarted while requests flow: the module's accounting reaches the new
    one. (Its subscription could come before the socket had dropped the old master's,
    and was filtered as a duplicate: the new master was counted as gone and every
    accounting message dropped.)"""
    with gate(tmp_path) as g:
        wait_for(lambda: g.stats()["master_connected"] == 1)
        for round_ in range(3):
            stop = threading.Event()

            def load(stop: threading.Event = stop) -> None:
                with httpx.Client(base_url=f"http://127.0.0.1:{g.port}", timeout=10) as c:
                    while not stop.is_set():
                        c.get("/", headers={"x-client": "steady"})

            with ThreadPoolExecutor(4) as pool:
                for _ in range(4):
                    pool.submit(load)
                time.sleep(0.3)
                g.master.stop()
                g.master = run_smockron(
                    master_args(g.acc, g.ctl, rules=("api:5/s:5",)),
                    tmp_path / f"master{round_}.log",
                )
                time.sleep(0.5)
                stop.set()
            wait_for(lambda: g.stats()["master_connected"] == 1)
            wanted = g.stats()["accounting_sent_total"] + 5
            for i in range(5):
                decide(g.client, f"after{round_}-{i}")
            wait_for(functools.partial(sent_at_least, g, wanted))
        g.master.stop()
