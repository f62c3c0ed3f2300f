"""Protected by default: without keys, the master and router bind loopback only."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from smockron.curve import InsecureBindError, bind_mode, is_loopback
from smockron.master.config import MasterSettings, load_settings
from tests.master.client import FakeGatekeeper
from tests.security.conftest import Keys
from tests.support import REPO_ROOT, free_ports, run_smockron, smockron_env, stopping, wait_for


@pytest.mark.parametrize(
    ("endpoint", "local"),
    [
        ("tcp://127.0.0.1:10004", True),
        ("tcp://127.8.9.10:10004", True),
        ("tcp://localhost:10004", True),
        ("tcp://[::1]:10004", True),
        ("ipc:///run/smockron/acc", True),
        ("inproc://accounting", True),
        ("tcp://*:10004", False),
        ("tcp://0.0.0.0:10004", False),
        ("tcp://[::]:10004", False),
        ("tcp://10.1.2.3:10004", False),
        ("tcp://eth0:10004", False),
        ("tcp://master.example:10004", False),
        ("ws://127.0.0.1:8080/acc", True),
        ("ws://0.0.0.0:8080/acc", False),
        ("epgm://eth0;239.1.1.1:5555", False),
        ("127.0.0.1:10004", False),  # not an endpoint: never called local
    ],
)
def test_is_loopback(endpoint: str, local: bool) -> None:
    assert is_loopback(endpoint) is local


def test_bind_mode_says_which_mode_in_one_line() -> None:
    loop = ("tcp://127.0.0.1:1", "tcp://127.0.0.1:2")
    wild = ("tcp://*:1", "tcp://127.0.0.1:2")
    assert bind_mode(loop, None, False) == (
        logging.INFO,
        "control plane: no authentication, loopback only",
    )
    with pytest.raises(InsecureBindError, match=r"refusing to bind tcp://\*:1 without"):
        bind_mode(wild, None, False)
    warning = "control plane: NO AUTHENTICATION on tcp://*:1 (--insecure-bind)"
    assert bind_mode(wild, None, True) == (logging.WARNING, warning)
    assert bind_mode(wild, 3, False) == (
        logging.INFO,
        "control plane: CURVE, 3 allowed gatekeepers",
    )


def test_defaults_are_loopback() -> None:
    settings = MasterSettings()
    assert is_loopback(settings.accounting) and is_loopback(settings.control)


def _refused(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = smockron_env()
    env.pop("SMOCKRON_MASTER_INSECURE_BIND", None)
    return subprocess.run(
        [sys.executable, "-m", "smockron", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize("command", ["master", "router"])
def test_a_wildcard_bind_without_keys_is_refused_in_one_line(command: str) -> None:
    acc, ctl, macc, mctl = free_ports(4)
    args = [command, "--accounting", f"tcp://*:{acc}", "--control", f"tcp://127.0.0.1:{ctl}"]
    if command == "router":
        args += ["--master", f"tcp://127.0.0.1:{macc},tcp://127.0.0.1:{mctl}"]
    done = _refused(args)
    assert done.returncode == 2
    lines = (done.stdout + done.stderr).splitlines()
    assert lines == [
        f"smockron {command}: error: refusing to bind tcp://*:{acc} without authentication: "
        "give --curve-secret "
        "and --curve-clients (keys from `smockron keygen`), bind a loopback address such as "
        "tcp://127.0.0.1:10004, or pass --insecure-bind"
    ]


def test_insecure_bind_is_the_operators_explicit_choice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    acc, ctl = free_ports(2)
    args = [
        "master",
        "--accounting",
        f"tcp://0.0.0.0:{acc}",
        "--control",
        f"tcp://127.0.0.1:{ctl}",
        "--rule",
        "probe:1/s:1",
    ]
    monkeypatch.setenv("SMOCKRON_MASTER_INSECURE_BIND", "1")  # said by the environment
    master = run_smockron(args, tmp_path / "master.log")
    with stopping([master]):
        wait_for(lambda: "master: accounting SUB" in master.log(), 15)
        assert master.alive()
        line = f"control plane: NO AUTHENTICATION on tcp://0.0.0.0:{acc} (--insecure-bind)"
        assert master.log().count(line) == 1
        assert "WARNING" in next(x for x in master.log().splitlines() if line in x)


def test_loopback_default_serves_an_original_protocol_gatekeeper(tmp_path: Path) -> None:
    """No keys, loopback: the wire is the original one (NULL mechanism, no CURVE)."""
    acc, ctl = free_ports(2)
    args = [
        "master",
        "--accounting",
        f"tcp://127.0.0.1:{acc}",
        "--control",
        f"tcp://127.0.0.1:{ctl}",
        "--rule",
        "probe:1/s:1",
    ]
    with (
        stopping([run_smockron(args, tmp_path / "master.log")]) as (master,),
        FakeGatekeeper(acc, ctl) as gk,
    ):
        gk.handshake("probe")  # a DELAY_UNTIL came back to a plain ZeroMQ gatekeeper
        assert master.log().count("control plane: no authentication, loopback only") == 1


def test_keys_and_insecure_bind_in_the_config_file(tmp_path: Path, keys: Keys) -> None:
    """The master's TOML file says it as the flags do; an absent flag keeps the file's."""
    path = tmp_path / "master.toml"
    path.write_text(
        f'accounting = "tcp://0.0.0.0:10004"\ninsecure_bind = true\n'
        f'curve_secret = "{keys.secret("master")}"\ncurve_clients = "{keys.clients}"\n'
    )
    flags = {"insecure_bind": None, "curve_secret": None, "curve_clients": None}
    settings = load_settings(path, overrides=flags)
    assert settings.insecure_bind is True
    assert settings.curve_secret == str(keys.secret("master"))
    assert settings.curve_clients == str(keys.clients)
    assert load_settings(path, overrides={"insecure_bind": False}).insecure_bind is False
