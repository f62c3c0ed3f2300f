"""The pure pieces: the master watch, the throttled-identifier counts, readiness, the
counter layouts; and the listener's routes on a real socket."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from smockron.errors import ConfigError
from smockron.observe import (
    CountersCollector,
    Layout,
    MasterWatch,
    ObserveServer,
    Readiness,
    loop_alive,
    parse_listen,
)
from smockron.observe.http import MAX_CLIENTS
from smockron.observe.throttled import TopThrottled, escape_identifier
from tests.support import wait_for


def test_master_watch_not_ready_at_once_warns_after_grace_then_rate_limited() -> None:
    watch = MasterWatch("tcp://10.9.9.9:10005", started_ms=0)
    assert watch.problem(100, connected=False) is not None  # not ready from the start
    assert watch.warning(4_999, connected=False) is None  # grace
    first = watch.warning(5_000, connected=False)
    assert first is not None and "tcp://10.9.9.9:10005" in first and "5 s since start" in first
    assert watch.warning(30_000, connected=False) is None  # rate-limited
    assert watch.warning(65_000, connected=False) is not None  # re-warned after a minute


def test_master_watch_connected_or_recently_heard_is_ready() -> None:
    watch = MasterWatch("tcp://127.0.0.1:10005", started_ms=0)
    assert watch.problem(1_000, connected=True) is None
    watch.heard(2_000)
    assert watch.problem(12_000, connected=False) is None  # heard within STALE_MS
    problem = watch.problem(12_001, connected=False)
    assert problem is not None and "nothing heard for 10 s" in problem
    assert watch.warning(12_001, connected=False) is not None
    assert watch.warning(13_000, connected=True) is None  # back: the next outage warns at once
    assert watch.warning(40_000, connected=False) is not None


def test_master_watch_without_master_is_always_ready() -> None:
    watch = MasterWatch(None, started_ms=0)
    assert watch.problem(10**9, connected=False) is None
    assert watch.warning(10**9, connected=False) is None


def test_top_throttled_counts_bounds_and_escapes() -> None:
    top = TopThrottled(capacity=3, window_s=10)
    controls = [[b"api\0", b"DELAY_UNTIL", b"u%d" % (i % 5), b"1"] for i in range(20)]
    controls.append([b"api\0", b"DELAY_UNTIL", b"u0\x1b[2J\n", b"1"])
    top.add(controls, now_s=100.0)
    assert len(top.counts) == 3 and top.others == 20 + 1 - 12  # u0..u2 counted, 4 each
    assert top.top(2) == {"api": [("u0", 4), ("u1", 4)]}
    top.add([[b"api\0", b"DELAY_UNTIL", b"x", b"1"]], now_s=111.0)  # a new window
    assert top.top() == {"api": [("x", 1)]}
    assert escape_identifier(b"a\x1b[31m\nb\xff") == "a\\x1b[31m\\nb\\xff"
    assert len(escape_identifier(b"z" * 500)) == 80


def test_readiness_reports_failing_checks_and_exceptions() -> None:
    def broken() -> str | None:
        raise RuntimeError("boom")

    ready = Readiness({"a": lambda: None, "b": lambda: "b is down"})
    ready.add("c", broken)
    assert ready.failing() == {"b": "b is down", "c": "check raised RuntimeError: boom"}
    assert ready.names == ["a", "b", "c"]


def test_layout_groups_counters_and_gauges() -> None:
    layout = Layout(
        "smockron_x",
        gauges=frozenset({"open"}),
        groups={"decisions": ("verdict", ("accepted", "rejected"))},
    )
    registry = CollectorRegistry()
    values = {"accepted": 3, "rejected": 1, "open": 2, "errors": 5}
    registry.register(CountersCollector(layout, lambda: values))
    assert registry.get_sample_value("smockron_x_decisions_total", {"verdict": "accepted"}) == 3
    assert registry.get_sample_value("smockron_x_decisions_total", {"verdict": "rejected"}) == 1
    assert registry.get_sample_value("smockron_x_open") == 2
    assert registry.get_sample_value("smockron_x_errors_total") == 5


@pytest.mark.parametrize("bad", ["nocolon", "host:http", "host:70000"])
def test_parse_listen_refuses(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"HOST:PORT|not in"):
        parse_listen(bad)


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_listener_routes_and_404() -> None:
    state = {"ok": False}
    ready = Readiness({"store": lambda: None if state["ok"] else "store unreachable"})
    registry = CollectorRegistry()
    server = ObserveServer(
        "127.0.0.1:0", readiness=ready, registry=registry, stats=lambda: {"k": "v\n"}
    )
    try:
        assert _get(server.port, "/healthz") == (200, b"ok\n")  # no loop to watch
        status, body = _get(server.port, "/readyz")
        assert status == 503
        assert json.loads(body) == {"ready": False, "failing": {"store": "store unreachable"}}
        state["ok"] = True
        assert _get(server.port, "/readyz")[0] == 200
        assert json.loads(_get(server.port, "/stats")[1]) == {"k": "v\n"}
        status, body = _get(server.port, "/metrics")
        assert status == 200
        list(text_string_to_metric_families(body.decode()))  # parses
        for path in ("/", "/metric", "/healthz/x", "/../etc/passwd"):
            assert _get(server.port, path)[0] == 404, path
    finally:
        server.close()


def test_listener_busy_port_is_one_config_error() -> None:
    first = ObserveServer("127.0.0.1:0", readiness=Readiness())
    try:
        with pytest.raises(ConfigError, match="cannot serve metrics on"):
            ObserveServer(f"127.0.0.1:{first.port}", readiness=Readiness())
    finally:
        first.close()


def test_loop_alive_tells_a_stuck_loop() -> None:
    loop = asyncio.new_event_loop()
    release = threading.Event()
    started = threading.Event()

    def stuck() -> None:
        started.set()
        release.wait(5)

    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:
        assert loop_alive(loop, 2.0)
        loop.call_soon_threadsafe(stuck)
        started.wait(5)
        assert not loop_alive(loop, 0.3)
        release.set()
        assert loop_alive(loop, 2.0)
    finally:
        release.set()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
    assert not loop_alive(loop)


def test_monitoring_guide_names_every_metric() -> None:
    from pathlib import Path

    from smockron.gatekeeper._decider import Counters
    from smockron.observe.layouts import DTHROTTLE, GATEKEEPER, JARL, ROUTER

    guide = (Path(__file__).parents[2] / "docs" / "monitoring.md").read_text()
    gatekeeper_keys = set(Counters().as_dict()) | {
        "waiting",
        "delay_entries",
        "first_lines",
        "master_connected",
        "control_connected",
        "delay_table_evicted",
        "control_refused",
        "fail_open_errors",
        "bad_requests",
        "abandoned",
    }
    expected = [
        (GATEKEEPER, gatekeeper_keys),
        (ROUTER, {"forwarded", "relayed", "discarded"}),
        (JARL, {"accepted", "delayed", "accept_errors"}),
        (DTHROTTLE, set(DTHROTTLE.docs) | {"accepted", "refused"}),
    ]
    for layout, keys in expected:
        for family in layout.families(dict.fromkeys(keys, 0)):
            name = family.name + ("_total" if family.type == "counter" else "")
            assert f"`{name}" in guide, name


def test_listener_bounds_its_connections() -> None:
    server = ObserveServer("127.0.0.1:0", readiness=Readiness(), request_timeout_s=60)
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(MAX_CLIENTS)]
    try:
        deadline = time.monotonic() + 30
        while server._slots._value > 0 and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.01)  # every idle connection has its thread
        assert server._slots._value == 0  # type: ignore[attr-defined]
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as extra:
            extra.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            assert extra.recv(100) == b""  # closed unanswered
        assert server.bad_requests == 1
    finally:
        for s in idle:
            s.close()
    try:
        wait_for(lambda: _get(server.port, "/healthz")[0] == 200, 5)
    finally:
        server.close()


def test_listener_on_ipv6_and_a_failing_route() -> None:
    def broken() -> dict[str, object]:
        raise RuntimeError("collector bug")

    try:
        server = ObserveServer("[::1]:0", readiness=Readiness(), stats=broken)
    except ConfigError:
        pytest.skip("no IPv6 loopback on this machine")
    try:
        with urllib.request.urlopen(f"http://[::1]:{server.port}/healthz", timeout=5) as resp:
            assert resp.read() == b"ok\n"
        try:
            urllib.request.urlopen(f"http://[::1]:{server.port}/stats", timeout=5)
        except urllib.error.HTTPError as exc:
            assert exc.code == 500
        else:
            raise AssertionError("a failing route answered 200")
    finally:
        server.close()
