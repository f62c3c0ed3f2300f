"""One lifecycle for every daemon, on real processes: signals, exit codes, JSON logs."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from smockron.runtime import logfmt
from tests.support import (
    Proc,
    free_port,
    free_ports,
    run_smockron,
    smockron_env,
    wait_for,
    wait_port,
)


def _daemon_args(command: str) -> list[str]:
    """A command line that starts ``command`` on free loopback ports."""
    a, b = free_ports(2)
    return {
        "master": ["master", "--accounting", f"tcp://127.0.0.1:{a}",
                   "--control", f"tcp://127.0.0.1:{b}", "--rule", "api:1/s:1"],
        "router": ["router", "--accounting", f"tcp://127.0.0.1:{a}",
                   "--control", f"tcp://127.0.0.1:{b}",
                   "--master", f"tcp://127.0.0.1:{free_port()},tcp://127.0.0.1:{free_port()}"],
        "proxy": ["proxy", "--listen", f"127.0.0.1:{a}", "--upstream", "http://127.0.0.1:9",
                  "--domain", "api", "--accounting", f"tcp://127.0.0.1:{b}",
                  "--control", f"tcp://127.0.0.1:{free_port()}"],
        "cluster": ["cluster", "--grpc-address", f"127.0.0.1:{a}",
                    "--http-address", f"127.0.0.1:{b}"],
        "jarl": ["jarl", "--service", "s", "--requests", "1", "--period", "1",
                 "--ip", "127.0.0.1", "--port", str(a)],
        "dthrottle": ["dthrottle", "--listen", f"tcp:127.0.0.1:{a}"],
    }[command]  # fmt: skip


COMMANDS = ["master", "router", "proxy", "cluster", "jarl", "dthrottle"]


def _started(proc: Proc, command: str) -> Callable[[], bool]:
    return lambda: f"command={command}" in proc.log() or not proc.alive()


@pytest.mark.parametrize("command", COMMANDS)
def test_sigterm_stops_gracefully_and_json_logs_parse(command: str, tmp_path: Path) -> None:
    """Each daemon: the startup line names what is active, SIGTERM exits 0, and with
    ``--log-format json`` (after the subcommand) every line of stderr is one JSON object."""
    proc = run_smockron([*_daemon_args(command), "--log-format", "json"], tmp_path / "d.log")
    try:
        wait_for(_started(proc, command), timeout=20)
        assert proc.alive(), proc.log()
    finally:
        code = proc.stop(signal.SIGTERM)
    lines = [json.loads(line) for line in proc.log().splitlines()]
    assert code == 0, proc.log()
    assert all({"ts", "level", "logger", "msg"} <= set(entry) for entry in lines)
    starting = [e for e in lines if e.get("event") == "starting"]
    assert len(starting) == 1 and starting[0]["command"] == command
    assert {"loop", "extensions"} <= set(starting[0])
    assert any("received SIGTERM" in e["msg"] for e in lines), lines


@pytest.mark.parametrize("command", ["master", "jarl"])
def test_sigint_is_one_line_and_exit_130(command: str, tmp_path: Path) -> None:
    proc = run_smockron(_daemon_args(command), tmp_path / "d.log")
    try:
        wait_for(_started(proc, command), timeout=20)
    finally:
        code = proc.stop(signal.SIGINT)
    log = proc.log()
    assert code == 130, log
    assert log.count("interrupted") == 1 and "Traceback" not in log, log


def test_sighup_reloads_the_master_config_file(tmp_path: Path) -> None:
    config = tmp_path / "master.toml"
    a, b = free_ports(2)
    config.write_text(f'accounting = "tcp://127.0.0.1:{a}"\ncontrol = "tcp://127.0.0.1:{b}"\n'
                      'rules = ["api:1/s:1"]\n')  # fmt: skip
    proc = run_smockron(["master", "--config", str(config)], tmp_path / "m.log")
    try:
        wait_for(lambda: "control PUB on" in proc.log())
        config.write_text(config.read_text().replace("api:1/s:1", "api:7/s:3"))
        proc.popen.send_signal(signal.SIGHUP)
        wait_for(lambda: "reloaded" in proc.log())
        assert "api [history: 7/s:3]" in proc.log()
        assert proc.alive()
    finally:
        assert proc.stop() == 0


def test_sighup_reloads_dthrottle_rules(tmp_path: Path) -> None:
    config = tmp_path / "dthrottle.toml"
    port = free_port()
    config.write_text(f'listen = ["tcp:127.0.0.1:{port}"]\nburst = 1\n')
    proc = run_smockron(["dthrottle", "--config", str(config)], tmp_path / "d.log")
    try:
        wait_for(_started(proc, "dthrottle"))
        config.write_text(f'listen = ["tcp:127.0.0.1:{port}"]\nburst = 5\n')
        proc.popen.send_signal(signal.SIGHUP)
        wait_for(lambda: "reloaded: burst 5" in proc.log())
        assert proc.alive()
    finally:
        assert proc.stop() == 0


ENVOY = """
domain: edge
descriptors:
  - key: generic_key
    value: slowpath
    rate_limit: {unit: minute, requests_per_unit: 3}
"""


def test_sighup_reloads_the_cluster_envoy_files(tmp_path: Path) -> None:
    """With polling off (interval 0), SIGHUP alone reloads the Envoy descriptor files."""
    conf = tmp_path / "edge.yaml"
    conf.write_text(ENVOY)
    args = [*_daemon_args("cluster"), "--envoy-config", str(conf), "--envoy-reload-interval", "0"]
    proc = run_smockron(args, tmp_path / "c.log")
    try:
        wait_for(_started(proc, "cluster"), timeout=20)
        conf.write_text(ENVOY.replace("requests_per_unit: 3", "requests_per_unit: 70"))
        proc.popen.send_signal(signal.SIGHUP)
        wait_for(lambda: "envoy: reloaded 1 domain(s)" in proc.log())
        assert proc.alive()
    finally:
        assert proc.stop() == 0


def test_sighup_without_a_config_file_says_so_and_keeps_serving(tmp_path: Path) -> None:
    """Also: ``--log-format json`` before the subcommand, the level from the environment."""
    args = ["--log-format", "json", *_daemon_args("dthrottle")]  # no --config given
    proc = run_smockron(args, tmp_path / "j.log")
    try:
        wait_for(_started(proc, "dthrottle"))
        proc.popen.send_signal(signal.SIGHUP)
        wait_for(lambda: "no config file to reload" in proc.log())
        assert proc.alive()
    finally:
        assert proc.stop() == 0
    entries = [json.loads(line) for line in proc.log().splitlines()]
    assert any("no config file to reload" in e["msg"] for e in entries)


def test_log_level_and_format_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SMOCKRON_LOG_FORMAT", "json")
    monkeypatch.setenv("SMOCKRON_LOG_LEVEL", "WARNING")  # hides the INFO startup line
    args = _daemon_args("jarl")
    proc = run_smockron(args, tmp_path / "j.log")
    try:
        wait_port(int(args[args.index("--port") + 1]), timeout=20)  # serving: signals handled
    finally:
        code = proc.stop(signal.SIGINT)
    entries = [json.loads(line) for line in proc.log().splitlines()]
    assert code == 130
    assert [e["level"] for e in entries] == ["WARNING"], entries  # only the Ctrl-C line


STUCK = """
import asyncio
from smockron import runtime

async def main(stop):
    print("ready", flush=True)
    await stop.wait()
    await asyncio.sleep(60)  # a close that never ends

runtime.configure_logging()
runtime.run(main, name="stuck", grace=0.5)
"""


def test_sigterm_deadline_exits_a_stuck_daemon(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", STUCK], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=smockron_env())  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 1
    assert time.monotonic() - started < 5
    assert proc.stderr is not None and "not stopped 0.5 s after SIGTERM" in proc.stderr.read()


def test_demo_ctrl_c_is_one_line_and_exit_130(tmp_path: Path) -> None:
    """Ctrl-C reaches the demo and its master (one process group, as in a terminal)."""
    proc = run_smockron(["demo", "--duration", "20"], tmp_path / "demo.log")
    try:
        wait_for(lambda: "polite client" in proc.log(), timeout=30)
        time.sleep(1.0)  # clients in flight
    finally:
        code = proc.stop(signal.SIGINT)
    log = proc.log()
    assert code == 130, log
    assert "interrupted" in log and "Traceback" not in log and "never retrieved" not in log


def test_a_startup_failure_in_json_mode_is_one_json_line(tmp_path: Path) -> None:
    args = _daemon_args("jarl")
    port = int(args[args.index("--port") + 1])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        command = [sys.executable, "-m", "smockron", "--log-format", "json", *args]
        out = subprocess.run(
            command, capture_output=True, text=True, env=smockron_env(), timeout=60, check=False
        )
    entries = [json.loads(line) for line in out.stderr.splitlines()]
    assert out.returncode == 1
    assert entries[-1]["level"] == "ERROR"
    assert entries[-1]["msg"].startswith(f"smockron jarl: error: cannot listen on 127.0.0.1:{port}")


def test_logfmt_quotes_what_needs_it() -> None:
    assert logfmt({"a": 1, "b": 0.5, "c": "two words", "d": 'q"'}) == (
        'a=1 b=0.5 c="two words" d="q\\""'
    )
