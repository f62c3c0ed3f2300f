"""``smockron router`` with keys on both sides: CURVE server to the gatekeepers (its own
allow-list), CURVE client to the masters (pinning their key, dialling again after a
refused handshake)."""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

from smockron.curve import keygen
from smockron.wire.codec import ACCEPTED, encode_accounting
from tests.security.conftest import Keys
from tests.security.peers import Peer
from tests.support import Proc, free_ports, run_smockron, stopping, wait_for


def probe(peer: Peer) -> bool:
    at = int(time.time() * 1000)
    peer.send([encode_accounting("probe", ACCEPTED, b"p", at) for _ in range(5)])
    return any(c.identifier == b"p" for c in peer.controls(0.1))


def start(
    keys: Keys,
    tmp_path: Path,
    master_clients: Path,
    router_clients: Path,
    addresses: tuple[str, str, str, str],
) -> tuple[Proc, Proc]:
    """A master allowing ``master_clients`` and a router in front of it, CURVE on both
    sides: the router allowing ``router_clients`` and pinning the master's key."""
    acc, ctl, racc, rctl = addresses
    master = run_smockron(
        [
            "master",
            "--accounting",
            acc,
            "--control",
            ctl,
            "--rule",
            "probe:1/s:1",
            "--curve-secret",
            str(keys.secret("master")),
            "--curve-clients",
            str(master_clients),
        ],
        tmp_path / "master.log",
    )
    router = run_smockron(
        [
            "router",
            "--accounting",
            racc,
            "--control",
            rctl,
            "--master",
            f"{acc},{ctl}",
            "--curve-secret",
            str(keys.secret("router")),
            "--curve-clients",
            str(router_clients),
            "--curve-server",
            str(keys.public("master")),
        ],
        tmp_path / "router.log",
    )
    return master, router


def test_router_with_keys_on_both_sides(keys: Keys, tmp_path: Path) -> None:
    keygen(keys.dir, "router")
    master_clients = tmp_path / "master-clients"
    master_clients.mkdir()  # the router's key is not allowed yet
    acc, ctl, racc, rctl = (f"tcp://127.0.0.1:{p}" for p in free_ports(4))
    master, router = start(keys, tmp_path, master_clients, keys.clients, (acc, ctl, racc, rctl))
    with stopping([master, router]):
        wait_for(lambda: "router: accounting" in router.log(), 15)
        assert "control plane: CURVE, 1 allowed gatekeeper" in router.log()
        gk = Peer(racc, rctl, keys.client("gk", master="router"))  # it pins the router
        try:
            wait_for(lambda: "handshake with master" in router.log(), 10)
            assert not probe(gk)
            shutil.copy(keys.public("router"), master_clients)
            master.popen.send_signal(signal.SIGHUP)
            wait_for(lambda: probe(gk), 15, 0)  # the router dialled the master again
        finally:
            gk.close()


def test_router_rereads_its_allowed_keys_on_sighup(keys: Keys, tmp_path: Path) -> None:
    keygen(keys.dir, "router")
    keygen(keys.dir, "late")  # a gatekeeper the router does not allow yet
    master_clients = tmp_path / "master-clients"
    master_clients.mkdir()
    shutil.copy(keys.public("router"), master_clients)
    router_clients = tmp_path / "router-clients"
    router_clients.mkdir()
    acc, ctl, racc, rctl = (f"tcp://127.0.0.1:{p}" for p in free_ports(4))
    master, router = start(keys, tmp_path, master_clients, router_clients, (acc, ctl, racc, rctl))
    with stopping([master, router]):
        wait_for(lambda: "control plane: CURVE, 0 allowed gatekeeper" in router.log(), 15)
        refused = Peer(racc, rctl, keys.client("late", master="router"))
        try:
            assert not probe(refused)  # refused by the router's allow-list
        finally:
            refused.close()
        shutil.copy(keys.public("late"), router_clients)
        router.popen.send_signal(signal.SIGHUP)
        wait_for(lambda: "CURVE, 1 allowed gatekeeper key(s)" in router.log(), 10)
        gk = Peer(racc, rctl, keys.client("late", master="router"))  # a raw peer: no redial
        try:
            wait_for(lambda: probe(gk), 15, 0)
            # the key removed: the open connection is cut at the SIGHUP
            (router_clients / "late.key").unlink()
            router.popen.send_signal(signal.SIGHUP)
            wait_for(lambda: "1 key(s) revoked" in router.log(), 10)
            time.sleep(0.5)
            gk.controls(0.2)
            assert not any(probe(gk) for _ in range(5))
        finally:
            gk.close()
