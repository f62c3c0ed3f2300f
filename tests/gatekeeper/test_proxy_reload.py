"""SIGHUP on a real ``smockron proxy``: its settings read again, the reloadable ones applied."""

from __future__ import annotations

import signal
import urllib.request
from pathlib import Path

from tests.gatekeeper.backend import backend
from tests.gatekeeper.commands import proxy_args
from tests.support import Proc, free_ports, run_smockron, stopping, wait_for, wait_port


def _decision(port: int, who: str) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/", headers={"X-Client": who})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return str(resp.headers.get("X-Smockron-Decision", ""))
    except urllib.error.HTTPError as exc:
        return str(exc.headers.get("X-Smockron-Decision", str(exc.code)))


def test_sighup_applies_the_new_rules_and_reports_what_needs_a_restart(tmp_path: Path) -> None:
    listen, acc, ctl = free_ports(3)
    config = tmp_path / "proxy.toml"
    config.write_text('rule = ["api:1/m:1"]\nmax_delay = "0s"\n')
    procs: list[Proc] = []
    with backend() as (up, _seen), stopping(procs):
        args = proxy_args(
            listen,
            up,
            f"tcp://127.0.0.1:{acc}",
            f"tcp://127.0.0.1:{ctl}",
            "--config",
            str(config),
            "--decision-header",
            "--no-master-rules",
            max_delay=None,  # the file's
        )
        procs.append(run_smockron(args, tmp_path / "proxy.log"))
        proc = procs[0]
        wait_port(listen)
        assert [_decision(listen, "a") for _ in range(3)] == ["accept", "reject", "reject"]

        config.write_text('rule = ["api:100/s:100"]\nmax_delay = "2s"\nreject_status = "429"\n')
        proc.popen.send_signal(signal.SIGHUP)
        wait_for(lambda: "reloaded " in proc.log(), 10)
        assert "reject_status changed but need a restart" in proc.log()
        assert "api:100/s:100" in proc.log()
        assert [_decision(listen, "b") for _ in range(5)] == ["accept"] * 5

        config.write_text('rule = ["api:not-a-rule"]\n')  # refused: the running rules stay
        proc.popen.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload failed, keeping the running settings" in proc.log(), 10)
        assert [_decision(listen, "c") for _ in range(5)] == ["accept"] * 5
        assert proc.alive()
