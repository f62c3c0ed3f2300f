"""A ``--metrics`` address that is taken is one line and exit 1, for every daemon."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.support import REPO_ROOT, free_ports, smockron_env


def _commands() -> dict[str, list[str]]:
    a, b, c, d = free_ports(4)
    return {
        "router": [
            "router",
            "--accounting",
            f"tcp://127.0.0.1:{a}",
            "--control",
            f"tcp://127.0.0.1:{b}",
            "--master",
            f"tcp://127.0.0.1:{c},tcp://127.0.0.1:{d}",
        ],
        "proxy": [
            "proxy",
            "--listen",
            f"127.0.0.1:{a}",
            "--upstream",
            "http://127.0.0.1:1",
            "--domain",
            "api",
            "--accounting",
            f"tcp://127.0.0.1:{b}",
            "--control",
            f"tcp://127.0.0.1:{c}",
        ],
        "jarl": [
            "jarl",
            "--service",
            "s",
            "--requests",
            "1",
            "--period",
            "1",
            "--ip",
            "127.0.0.1",
            "--port",
            str(a),
        ],
        "dthrottle": ["dthrottle", "--listen", f"tcp:127.0.0.1:{a}"],
        "cluster": [
            "cluster",
            "--grpc-address",
            f"127.0.0.1:{a}",
            "--http-address",
            f"127.0.0.1:{b}",
            "--peers",
            f"127.0.0.1:{a}",
        ],
    }


@pytest.mark.parametrize("command", ["router", "proxy", "jarl", "dthrottle", "cluster"])
def test_busy_metrics_port_is_one_line(command: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = taken.getsockname()[1]
        args = [*_commands()[command], "--metrics", f"127.0.0.1:{busy}"]
        done = subprocess.run(
            [sys.executable, "-m", "smockron", *args],
            capture_output=True,
            text=True,
            env=smockron_env(),
            cwd=REPO_ROOT,
            timeout=30,
        )
    assert done.returncode == 1, done.stderr
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith(f"smockron {command}: error:")]
    assert len(errors) == 1 and f"cannot serve metrics on 127.0.0.1:{busy}" in errors[0]
    assert "Traceback" not in done.stderr
