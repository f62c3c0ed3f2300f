"""The nginx module and a CURVE master: keys from `smockron keygen`, the master's pinned."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import zmq

from smockron.curve import keygen
from tests.nginx.servers import gate, require_module
from tests.support import wait_for

pytestmark = pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")


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
    curve = (
        f"smockron_curve_secret {keys / 'nginx.key_secret'};\n"
        f"    smockron_curve_server {keys / f'{pinned}.key'};"
    )
    with gate(
        tmp_path,
        "--curve-secret",
        str(keys / "master.key_secret"),
        "--curve-clients",
        str(clients),
        http=curve,
    ) as g:
        if pinned == "master":
            wait_for(lambda: g.stats()["master_connected"] == 1)
            wait_for(lambda: g.stats()["rules_received_total"] >= 1)
            assert g.stats()["auth_problem"] == 0
            got = [
                g.client.get("/", headers={"x-client": "a"}).headers["x-smockron-decision"]
                for _ in range(7)
            ]
            assert got == ["accept"] * 5 + ["delay"] * 2, got
        else:
            # whoever holds the port without the master's secret feeds it nothing
            wait_for(lambda: g.stats()["auth_problem"] == 1)
            time.sleep(0.5)
            counters = g.stats()
            assert counters["handshakes_failed_total"] >= 1
            assert counters["rules_received_total"] == 0
            assert counters["control_connected"] == 0
            assert "check the CURVE keys" in (tmp_path / "nginx" / "error.log").read_text()
