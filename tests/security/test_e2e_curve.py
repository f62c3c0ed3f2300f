"""``smockron keygen``, ``smockron master`` and ``smockron proxy`` as real processes,
with keys: verdicts flow to an allowed proxy; a proxy whose key is not allowed is
refused, counted, let in by a SIGHUP once its key is copied in, and cut by a SIGHUP
once its key is removed."""

from __future__ import annotations

import shutil
import signal
import time
import urllib.request
from collections import Counter
from pathlib import Path

import httpx

from tests.gatekeeper.backend import backend
from tests.gatekeeper.commands import proxy_args
from tests.support import (
    Proc,
    free_ports,
    master_args,
    run_smockron,
    stopping,
    wait_for,
    wait_port,
)


def keygen(folder: Path, name: str, log: Path) -> None:
    proc = run_smockron(["keygen", str(folder), name], log)
    assert proc.popen.wait(30) == 0, proc.log()
    proc.stop()


def denied(metrics_port: int) -> float:
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("smockron_master_auth_denied_total "):
                return float(line.split()[1])
    raise AssertionError("no smockron_master_auth_denied_total metric")


def burst(client: httpx.Client, who: str, n: int = 20) -> Counter[str]:
    seen: Counter[str] = Counter()
    for _ in range(n):
        r = client.get("/", headers={"x-client": who})
        seen[r.headers.get("x-smockron-decision", "none")] += 1
    return seen


def enforced(client: httpx.Client, who: str, timeout: float) -> bool:
    """Whether a burst is delayed or rejected within ``timeout`` (the rule is 5/s:5)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = burst(client, who)
        if seen["reject"] or seen["delay"]:
            return True
        time.sleep(0.2)
    return False


def test_master_and_proxies_with_keys(tmp_path: Path) -> None:
    keys, clients = tmp_path / "keys", tmp_path / "clients"
    for name in ("master", "good", "late"):
        keygen(keys, name, tmp_path / "keygen.log")
    clients.mkdir()
    shutil.copy(keys / "good.key", clients)
    acc, ctl, met, p_good, p_late = free_ports(5)
    zmq = (f"tcp://127.0.0.1:{acc}", f"tcp://127.0.0.1:{ctl}")
    args = master_args(
        acc,
        ctl,
        "--curve-secret",
        str(keys / "master.key_secret"),
        "--curve-clients",
        str(clients),
        rules=["e2e:5/s:5"],
        metrics=met,
    )
    with backend() as (up, _seen):
        procs: list[Proc] = [run_smockron(args, tmp_path / "master.log")]
        for port, name in ((p_good, "good"), (p_late, "late")):
            curve = [
                "--curve-secret",
                str(keys / f"{name}.key_secret"),
                "--curve-server",
                str(keys / "master.key"),
            ]
            args = proxy_args(
                port,
                up,
                *zmq,
                "--decision-header",
                "--no-master-rules",
                *curve,
                domain="e2e",
                max_delay="200ms",
            )
            procs.append(run_smockron(args, tmp_path / f"{name}.log"))
        master, _good_proxy, late_proxy = procs
        with (
            stopping(procs),
            httpx.Client(base_url=f"http://127.0.0.1:{p_good}", timeout=10) as good,
            httpx.Client(base_url=f"http://127.0.0.1:{p_late}", timeout=10) as late,
        ):
            for port in (met, p_good, p_late):
                wait_port(port)
            assert "control plane: CURVE, 1 allowed gatekeeper" in master.log()
            # DELAY_UNTILs only (no first line): accounting in and verdicts out, over CURVE
            assert enforced(good, "abuser", 20)
            # the late proxy's key is not allowed: its traffic is not counted, nor limited
            wait_for(lambda: denied(met) >= 1, 10)
            assert not enforced(late, "other", 1.5)
            assert "CURVE handshake denied" in master.log()
            assert "the master refused this gatekeeper's key" in late_proxy.log()
            # the operator allows it: SIGHUP rereads the directory, the proxy dials again
            shutil.copy(keys / "late.key", clients)
            master.popen.send_signal(signal.SIGHUP)
            wait_for(lambda: "CURVE, 2 allowed gatekeeper key(s)" in master.log(), 10)
            assert enforced(late, "other", 20)
            # and revokes it: at the SIGHUP its open connections are cut, not at its restart
            (clients / "late.key").unlink()
            master.popen.send_signal(signal.SIGHUP)
            wait_for(lambda: "1 key(s) revoked" in master.log(), 10)
            assert not enforced(late, "third", 1.5)
            assert enforced(good, "fourth", 20)  # the allowed proxy reconnected
