"""One lifecycle for every daemon, on real processes: signals, exit codes, JSON logs."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from smockron import compiled, runtime
from smockron.runtime import logfmt
from tests.support import (
    REPO_ROOT,
    Proc,
    daemon_args,
    free_port,
    free_ports,
    run_smockron,
    smockron_env,
    smockron_run,
    twins,
    wait_for,
    wait_port,
)

COMMANDS = ["master", "router", "proxy", "cluster", "jarl", "dthrottle"]


def _started(proc: Proc, command: str) -> Callable[[], bool]:
    return lambda: f"command={command}" in proc.log() or not proc.alive()


@pytest.mark.parametrize("command", COMMANDS)
def test_sigterm_stops_gracefully_and_json_logs_parse(command: str, tmp_path: Path) -> None:
    """Each daemon: the startup line names what is active, SIGTERM exits 0, and with
    ``--log-format json`` (after the subcommand) every line of stderr is one JSON object."""
    proc = run_smockron([*daemon_args(command), "--log-format", "json"], tmp_path / "d.log")
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
    proc = run_smockron(daemon_args(command), tmp_path / "d.log")
    try:
        wait_for(_started(proc, command), timeout=20)
    finally:
        code = proc.stop(signal.SIGINT)
    log = proc.log()
    assert code == 130, log
    assert log.count("interrupted") == 1 and "Traceback" not in log, log


def _sighup(args: list[str], log: Path, ready: str, edit: Callable[[], object], said: str) -> str:
    """Start ``args``; once ``ready`` is in its log, ``edit`` its files and send SIGHUP:
    ``said`` appears in the log, it keeps running, and SIGTERM then exits 0. Its log."""
    proc = run_smockron(args, log)
    try:
        wait_for(lambda: ready in proc.log() or not proc.alive(), timeout=20)
        edit()
        proc.popen.send_signal(signal.SIGHUP)
        wait_for(lambda: said in proc.log())
        assert proc.alive()
    finally:
        assert proc.stop() == 0
    return proc.log()


def test_sighup_reloads_the_master_config_file(tmp_path: Path) -> None:
    config = tmp_path / "master.toml"
    a, b = free_ports(2)
    config.write_text(
        f'accounting = "tcp://127.0.0.1:{a}"\ncontrol = "tcp://127.0.0.1:{b}"\n'
        'rules = ["api:1/s:1"]\n'
    )
    log = _sighup(
        ["master", "--config", str(config)],
        tmp_path / "m.log",
        "control PUB on",
        lambda: config.write_text(config.read_text().replace("api:1/s:1", "api:7/s:3")),
        "reloaded",
    )
    assert "api [history: 7/s:3]" in log


def test_sighup_reloads_dthrottle_rules(tmp_path: Path) -> None:
    config = tmp_path / "dthrottle.toml"
    port = free_port()
    config.write_text(f'listen = ["tcp:127.0.0.1:{port}"]\nburst = 1\n')
    _sighup(
        ["dthrottle", "--config", str(config)],
        tmp_path / "d.log",
        "command=dthrottle",
        lambda: config.write_text(f'listen = ["tcp:127.0.0.1:{port}"]\nburst = 5\n'),
        "reloaded: burst 5",
    )


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
    _sighup(
        [*daemon_args("cluster"), "--envoy-config", str(conf), "--envoy-reload-interval", "0"],
        tmp_path / "c.log",
        "command=cluster",
        lambda: conf.write_text(ENVOY.replace("requests_per_unit: 3", "requests_per_unit: 70")),
        "envoy: reloaded 1 domain(s)",
    )


def test_sighup_without_a_config_file_says_so_and_keeps_serving(tmp_path: Path) -> None:
    """Also: ``--log-format json`` before the subcommand, the level from the environment."""
    log = _sighup(
        ["--log-format", "json", *daemon_args("dthrottle")],  # no --config given
        tmp_path / "j.log",
        "command=dthrottle",
        lambda: None,
        "no config file to reload",
    )
    entries = [json.loads(line) for line in log.splitlines()]
    assert any("no config file to reload" in e["msg"] for e in entries)


def test_log_level_and_format_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SMOCKRON_LOG_FORMAT", "json")
    monkeypatch.setenv("SMOCKRON_LOG_LEVEL", "WARNING")  # hides the INFO startup line
    args = daemon_args("jarl")
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
    proc = subprocess.Popen(
        [sys.executable, "-c", STUCK],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=smockron_env(),
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(10)  # a hang guard; the message below says the deadline did it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 1
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
    args = daemon_args("jarl")
    port = int(args[args.index("--port") + 1])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        out = smockron_run(["--log-format", "json", *args])
    entries = [json.loads(line) for line in out.stderr.splitlines()]
    assert out.returncode == 1
    assert entries[-1]["level"] == "ERROR"
    assert entries[-1]["msg"].startswith(f"smockron jarl: error: cannot listen on 127.0.0.1:{port}")


def test_logfmt_quotes_what_needs_it() -> None:
    assert logfmt({"a": 1, "b": 0.5, "c": "two words", "d": 'q"'}) == (
        'a=1 b=0.5 c="two words" d="q\\""'
    )


# ---------------------------------------------------------------------------- compiled twins


def _starting_line(extra_env: dict[str, str], prelude: str = "") -> tuple[int, str]:
    """Start a master in a fresh interpreter (``prelude`` run first), stop it once it has
    logged its startup line: (exit code, its stderr)."""
    a, b = free_ports(2)
    script = (
        f"import sys\n{prelude}\nfrom smockron.cli import main\n"
        f"main(['master', '--accounting', 'tcp://127.0.0.1:{a}', "
        f"'--control', 'tcp://127.0.0.1:{b}', '--rule', 'api:1/s:1'])\n"
    )
    env = {**smockron_env(), **extra_env}
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if "starting command=master" in line:
            proc.send_signal(signal.SIGTERM)
    return proc.wait(20), "".join(lines)


def test_the_startup_line_names_the_extensions_loaded_not_the_files() -> None:
    """With ``SMOCKRON_PURE_PYTHON=1`` none is loaded, and the line says so; without, it
    names what the master uses (``_zmqfast``) and nothing it did not load."""
    code, log = _starting_line({"SMOCKRON_PURE_PYTHON": "1"})
    assert code == 0 and " extensions=none " in log, log
    if compiled.load("_zmqfast") is None:
        pytest.skip("_zmqfast is not built here")
    code, log = _starting_line({"SMOCKRON_PURE_PYTHON": "0", "SMOCKRON_REQUIRE_COMPILED": "1"})
    assert code == 0 and " extensions=_zmqfast " in log, log


def test_require_compiled_refuses_to_start_without_a_twin() -> None:
    """``SMOCKRON_REQUIRE_COMPILED=1`` on a machine where ``_localfast`` did not build
    (its import made to fail): exit 2 before serving, naming it and what to install."""
    prelude = "sys.modules['smockron.cluster._localfast'] = None  # as if not built"
    code, log = _starting_line(
        {"SMOCKRON_REQUIRE_COMPILED": "1", "SMOCKRON_PURE_PYTHON": "0"}, prelude
    )
    assert code == 2, log
    assert "_localfast not built" in log and "SMOCKRON_REQUIRE_COMPILED=1" in log, log
    assert "starting command=master" not in log
    # without the switch the same machine starts, on the Python twin
    code, log = _starting_line({"SMOCKRON_REQUIRE_COMPILED": "0"}, prelude)
    assert code == 0 and "starting command=master" in log, log


def test_require_compiled_and_pure_python_pure_python_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SMOCKRON_REQUIRE_COMPILED", "1")
    monkeypatch.setenv("SMOCKRON_PURE_PYTHON", "1")
    assert compiled.load("_zmqfast") is None
    compiled.require()  # nothing wanted, nothing missing
    monkeypatch.setenv("SMOCKRON_PURE_PYTHON", "0")
    monkeypatch.setitem(sys.modules, "smockron.cluster._native", None)
    with pytest.raises(compiled.MissingCompiled, match="_native not built"):
        compiled.load("_native")


def test_twins_fail_under_require_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """tests.support.twins: a missing compiled twin is a visible skip, or a failure when
    the run requires compiled twins (scripts/test), never silently dropped."""
    monkeypatch.setenv("SMOCKRON_REQUIRE_COMPILED", "0")
    params = twins(len, None, "_tablefast")
    assert [p.id for p in params] == ["python", "compiled"] and params[1].marks
    monkeypatch.setenv("SMOCKRON_REQUIRE_COMPILED", "1")
    monkeypatch.setenv("SMOCKRON_PURE_PYTHON", "0")
    with pytest.raises(compiled.MissingCompiled):
        twins(len, None, "_tablefast")
    assert [p.id for p in twins(len, abs, "_tablefast")] == ["python", "compiled"]


def test_every_extension_setup_builds_is_in_the_registry() -> None:
    """One list: what setup.py builds is what smockron.compiled knows (and so what the
    startup line and SMOCKRON_REQUIRE_COMPILED cover); nothing else is built."""
    setup = (REPO_ROOT / "setup.py").read_text()
    built = set(re.findall(r'"(smockron\.[\w.]+)"', setup))
    assert built == {twin.module for twin in compiled.REGISTRY}


def test_the_allocator_named_is_the_operators_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONMALLOC", raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    expected = "pymalloc_debug" if sys.flags.dev_mode else "pymalloc"
    assert runtime.allocator() == expected
    if sys.flags.dev_mode:
        return
    monkeypatch.setenv("PYTHONMALLOC", "malloc")
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    assert runtime.allocator() == "malloc+jemalloc"
