"""The nginx module and a CURVE master: keys from `smockron keygen`, the master's pinned."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import zmq

from smockron.curve import keygen
from tests.gatekeeper.backend import backend
from tests.nginx.servers import nginx, require_module, stats_of
from tests.support import free_ports, master_args, run_smockron, stopping, wait_for

pytestmark = pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")


def stats(client: httpx.Client) -> dict[str, int]:
    return stats_of(client.get("/smockron").text)


@pytest.mark.parametrize("pinned", ["master", "impostor"])
def test_curve_master(tmp_path: Path, pinned: str) -> None:
    require_module()
    keys, clients = tmp_path / "keys", tmp_path / "clients"
    keys.mkdir()
    clients.mkdir()
    keygen(keys, "master")
    keygen(keys, "impostor")
    keygen(keys, "nginx")
    (clients / "nginx.key").write_bytes((keys / "nginx.key").read_bytes())
    acc, ctl, port = free_ports(3)
    master_cmd = master_args(
        acc,
        ctl,
        "--curve-secret",
        str(keys / "master.key_secret"),
        "--curve-clients",
        str(clients),
        rules=["api:5/s:5"],
    )
    curve = (
        f"smockron_curve_secret {keys / 'nginx.key_secret'};\n"
        f"    smockron_curve_server {keys / f'{pinned}.key'};"
    )
    with backend() as (up, _seen):
        master = run_smockron(master_cmd, tmp_path / "master.log")
        with (
            stopping([master]),
            nginx(tmp_path / "nginx", port=port, upstream=up, acc=acc, ctl=ctl, http=curve),
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client,
        ):
            if pinned == "master":
                wait_for(lambda: stats(client)["master_connected"] == 1)
                wait_for(lambda: stats(client)["rules_received_total"] >= 1)
                assert stats(client)["auth_problem"] == 0
                got = [
                    client.get("/", headers={"x-client": "a"}).headers["x-smockron-decision"]
                    for _ in range(7)
                ]
                assert got == ["accept"] * 5 + ["delay"] * 2, got
            else:
                # whoever holds the port without the master's secret feeds it nothing
                wait_for(lambda: stats(client)["auth_problem"] == 1)
                time.sleep(0.5)
                counters = stats(client)
                assert counters["handshakes_failed_total"] >= 1
                assert counters["rules_received_total"] == 0
                assert counters["control_connected"] == 0
                assert "check the CURVE keys" in (tmp_path / "nginx" / "error.log").read_text()
