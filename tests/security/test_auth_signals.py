"""A gatekeeper that cannot authenticate to its master says why, once a minute, and is not
ready; connections whose handshake fails are neither counted nor logged. A master whose
allow-list is empty says so at start. Real sockets, a real master (in a thread, and as a
process behind a real proxy)."""

from __future__ import annotations

import dataclasses
import logging
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from smockron.curve import CurveClient
from smockron.gatekeeper import Gatekeeper
from tests.gatekeeper.backend import backend
from tests.gatekeeper.commands import proxy_args
from tests.master.running import running_master, settings
from tests.security.conftest import Keys
from tests.support import free_ports, master_args, run_smockron, stopping, wait_for, wait_port

WATCH_S = 3.0
"""Long enough for libzmq and the gatekeeper to redial several times."""


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "smockron.gatekeeper" and text in r.getMessage()
    ]


@pytest.mark.parametrize(
    ("who", "reason"),
    [
        ("none", "CURVE and this gatekeeper has no keys"),
        ("wrong-server", "the key pinned with --curve-server is not the key of the master"),
        ("rogue", "the master refused this gatekeeper's key (ZAP status 400)"),
    ],
)
def test_a_gatekeeper_that_cannot_authenticate_says_why_and_is_not_ready(
    keys: Keys, caplog: pytest.LogCaptureFixture, who: str, reason: str
) -> None:
    curve: CurveClient | None = {
        "none": None,
        "wrong-server": keys.client("gk", master="rogue-master"),
        "rogue": keys.client("rogue"),
    }[who]
    config = dataclasses.replace(
        settings(), curve_secret=str(keys.secret("master")), curve_clients=str(keys.clients)
    )
    with running_master(config), caplog.at_level(logging.DEBUG, "smockron.gatekeeper"):
        gk = Gatekeeper(config.accounting, config.control, ["api"], curve=curve)
        try:
            wait_for(lambda: gk.auth_problem() is not None, 5)
            problem = gk.master_problem()
            assert problem is not None and reason in problem
            assert config.control in problem or config.accounting in problem
            time.sleep(WATCH_S)
            stats = gk.stats()
            assert stats["auth_problem"] == 1
            assert stats["handshakes_failed"] >= 2  # both sockets, redialled meanwhile
            assert stats["master_connected"] == stats["control_connected"] == 0
            assert reason in (gk.master_problem() or "")
        finally:
            gk.close()
    warnings = [
        r
        for r in caplog.records
        if r.name == "smockron.gatekeeper" and r.levelno >= logging.WARNING
    ]
    assert [r.getMessage() for r in warnings if "cannot authenticate" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]  # one line, naming the cause
    assert reason in warnings[0].getMessage()
    assert not _lines(caplog, "connected")  # no connection ever counted: none logged


def test_a_gatekeeper_with_the_right_keys_is_ready_and_logs_its_connections(
    keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    config = dataclasses.replace(
        settings(), curve_secret=str(keys.secret("master")), curve_clients=str(keys.clients)
    )
    with running_master(config), caplog.at_level(logging.INFO, "smockron.gatekeeper"):
        gk = Gatekeeper(config.accounting, config.control, ["api"], curve=keys.client("gk"))
        try:
            wait_for(lambda: gk.master_connected and gk.control_connected, 10)
            assert gk.master_problem() is None
            assert gk.stats()["auth_problem"] == 0
            assert gk.handshakes_failed == 0
        finally:
            gk.close()
    assert _lines(caplog, "accounting connected to")
    assert _lines(caplog, "control connected to")


def test_without_curve_a_plain_master_counts_its_connections(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = settings()
    with running_master(config), caplog.at_level(logging.INFO, "smockron.gatekeeper"):
        gk = Gatekeeper(config.accounting, config.control, ["api"])
        try:
            wait_for(lambda: gk.master_connected and gk.control_connected, 10)
            assert gk.master_problem() is None
            assert gk.auth_problem() is None
        finally:
            gk.close()
    assert len(_lines(caplog, "accounting connected to")) == 1


def test_a_master_with_an_empty_allow_list_warns_at_start_and_refuses_every_key(
    keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    (keys.clients / "gk.key").unlink()
    config = dataclasses.replace(
        settings(), curve_secret=str(keys.secret("master")), curve_clients=str(keys.clients)
    )
    with caplog.at_level(logging.WARNING), running_master(config):
        assert "holds no public key (*.key): every gatekeeper will be refused" in caplog.text
        gk = Gatekeeper(config.accounting, config.control, ["api"], curve=keys.client("gk"))
        try:
            wait_for(lambda: gk.auth_problem() is not None, 5)
            assert "refused this gatekeeper's key" in (gk.master_problem() or "")
        finally:
            gk.close()


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no {name} metric")


def test_a_proxy_without_keys_against_a_master_with_keys_is_not_ready(
    keys: Keys, tmp_path: Path
) -> None:
    acc, ctl, p_met, p_proxy, p_pmet = free_ports(5)
    zmq = (f"tcp://127.0.0.1:{acc}", f"tcp://127.0.0.1:{ctl}")
    args = master_args(
        acc,
        ctl,
        "--curve-secret",
        str(keys.secret("master")),
        "--curve-clients",
        str(keys.clients),
        rules=["api:5/s:5"],
        metrics=p_met,
    )
    with backend() as (up, _seen):
        master = run_smockron(args, tmp_path / "master.log")
        with stopping([master]) as procs:
            wait_port(p_met)
            args = proxy_args(p_proxy, up, *zmq, "--metrics", f"127.0.0.1:{p_pmet}")
            proxy = run_smockron(args, tmp_path / "proxy.log")
            procs.append(proxy)
            wait_port(p_pmet)
            wait_for(lambda: _readyz(p_pmet)[0] == 503, 5)
            time.sleep(WATCH_S)
            status, body = _readyz(p_pmet)
            assert status == 503 and "CURVE and this gatekeeper has no keys" in body, body
            assert _metric(p_pmet, "smockron_gatekeeper_auth_problem") == 1
            assert _metric(p_pmet, "smockron_gatekeeper_handshakes_failed_total") >= 2
            log = proxy.log()
            assert log.count("cannot authenticate to the master") == 1, log
            assert "connected" not in log.replace("disconnected", ""), log
            assert "disconnected" not in log, log
