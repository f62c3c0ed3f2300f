"""docs/tutorial.md, walked: each of its commands run as written (the ports moved to free
ones), the long-running ones as background processes, and what the text says they show
checked against what they print."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO_ROOT, free_ports, port_open, smockron_env, wait_for

TUTORIAL = REPO_ROOT / "docs" / "tutorial.md"
PORTS = (9000, 8080, 9100, 9101)


def blocks() -> list[str]:
    """The ``sh`` blocks of the tutorial, in order."""
    return re.findall(r"```sh\n(.*?)```", TUTORIAL.read_text(), re.S)


@pytest.fixture
def shell_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """``smockron`` and ``python3`` on the PATH as after the quick start (this checkout,
    this interpreter), and the master's default ports moved to free ones."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "smockron").write_text(f'#!/bin/sh\nexec {sys.executable} -m smockron "$@"\n')
    (bin_dir / "smockron").chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable)
    acc, ctl = free_ports(2)
    env = smockron_env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    for command in ("MASTER", "PROXY"):
        env[f"SMOCKRON_{command}_ACCOUNTING"] = f"tcp://127.0.0.1:{acc}"
        env[f"SMOCKRON_{command}_CONTROL"] = f"tcp://127.0.0.1:{ctl}"
    yield env


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("curl") is None, reason="the tutorial's clients are curl")
def test_the_tutorial_runs_as_written(shell_env: dict[str, str], tmp_path: Path) -> None:
    ports = dict(zip(PORTS, free_ports(len(PORTS)), strict=True))
    background: dict[str, subprocess.Popen[bytes]] = {}
    outputs: list[str] = []

    def moved(script: str) -> str:
        for old, new in ports.items():
            script = re.sub(rf"(?<=[:\s]){old}\b", str(new), script)
        return script

    def start(name: str, script: str) -> None:
        log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - the process holds it
        background[name] = subprocess.Popen(
            ["bash", "-c", f"exec {script}"],
            env=shell_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            start_new_session=True,
        )

    def log(name: str) -> str:
        return (tmp_path / f"{name}.log").read_text(errors="replace")

    try:
        for block in blocks():
            script = moved(block)
            first = script.splitlines()[0]
            if first.startswith(". .venv/bin/activate"):
                continue  # the PATH is set up by the fixture
            if "leave it running" in first:
                name = first.split(":")[1].split()[1]  # "the service (...)": service
                start(name, script.split("\n", 1)[1].strip())
                port = {"service": ports[9000], "master": ports[9100], "proxy": ports[9101]}
                wait_for(lambda p=port[name]: port_open(p), timeout=30)  # type: ignore[misc]
                continue
            done = subprocess.run(
                ["bash", "-ec", script],
                env=shell_env,
                capture_output=True,
                text=True,
                timeout=120,
                cwd=tmp_path,
            )
            assert done.returncode == 0, (block, done.stdout, done.stderr)
            outputs.append(done.stdout)
        ready, alice, bob, carol, top, metrics = outputs
        assert ready.count('"ready":true') == 2, ready
        assert alice.split().count("accept") == 5 and "delay" not in alice, alice
        bob_lines = bob.splitlines()
        assert all(line.startswith("200 accept") for line in bob_lines[:5]), bob
        assert sum("200 delay" in line for line in bob_lines) >= 10, bob
        counts = {m.group(2): int(m.group(1)) for m in re.finditer(r"(\d+) (\d{3} \w+)", carol)}
        assert counts.get("200 accept") == 5 and counts.get("503 reject", 0) >= 15, carol
        assert "bob" in top and "carol" in top and "alice" not in top, top
        assert 'smockron_master_messages_total{domain="api",status="rejected"}' in metrics
        assert 'smockron_gatekeeper_decisions_total{verdict="delayed"}' in metrics, metrics
        assert "first line for 'api': 2/s, 4 ahead" in log("proxy")

        # 8. the master goes away: the proxy fails open, and says so
        background["master"].send_signal(signal.SIGINT)
        assert background.pop("master").wait(20) == 130
        wait_for(lambda: "failing open" in log("proxy"), timeout=10)
        polite = next(b for b in blocks() if "alice" in b)
        alice_again = subprocess.run(
            ["bash", "-ec", moved(polite)],
            env=shell_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert alice_again.stdout.split().count("accept") == 5, alice_again.stdout
        greedy = moved(next(b for b in blocks() if "bob" in b)).replace("bob", "dave")
        dave = subprocess.run(
            ["bash", "-ec", greedy], env=shell_env, capture_output=True, text=True, timeout=60
        ).stdout
        assert dave.count("200 accept") == 5 and dave.count("200 delay") == 15, dave
    finally:
        for proc in background.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
        for proc in background.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
