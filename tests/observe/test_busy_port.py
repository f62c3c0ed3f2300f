"""A ``--metrics`` address that is taken is one line and exit 1, for every daemon."""

from __future__ import annotations

import socket

import pytest

from tests.support import daemon_args, smockron_run


@pytest.mark.parametrize("command", ["router", "proxy", "jarl", "dthrottle", "cluster"])
def test_busy_metrics_port_is_one_line(command: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = taken.getsockname()[1]
        done = smockron_run([*daemon_args(command), "--metrics", f"127.0.0.1:{busy}"], 30)
    assert done.returncode == 1, done.stderr
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith(f"smockron {command}: error:")]
    assert len(errors) == 1 and f"cannot serve metrics on 127.0.0.1:{busy}" in errors[0]
    assert "Traceback" not in done.stderr
