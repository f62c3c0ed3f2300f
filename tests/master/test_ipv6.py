"""``tcp://[::1]:P`` (IPv6 loopback, protected mode's loopback) binds and connects: the
master, a router between, and a gatekeeper, each over IPv6."""

from __future__ import annotations

import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest
import zmq

from smockron.curve import allow_ipv6
from smockron.gatekeeper._link import now_ms
from smockron.gatekeeper._threaded import Gatekeeper
from tests.master.running import running_master, settings
from tests.support import free_ports, smockron_proc, wait_for


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


pytestmark = pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback here")


def v6(port: int) -> str:
    return f"tcp://[::1]:{port}"


def delayed(gk: Gatekeeper, timeout: float) -> bool:
    """Over the rule's burst: the master's DELAY_UNTIL reaches the gatekeeper."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gk.decide(b"api", b"client")
        if gk.decider.table.until(b"api", b"client", now_ms()):
            return True
        time.sleep(0.05)
    return False


def test_master_binds_and_a_gatekeeper_connects_over_ipv6() -> None:
    acc, ctl = free_ports(2)
    config = replace(settings(api="1/60s:1"), accounting=v6(acc), control=v6(ctl))
    with running_master(config) as master:
        assert master.sub.getsockopt_string(zmq.LAST_ENDPOINT) == v6(acc)
        gk = Gatekeeper(v6(acc), v6(ctl), ["api"])
        try:
            assert delayed(gk, 10)
        finally:
            gk.close()


def test_router_between_over_ipv6(tmp_path: Path) -> None:
    acc, ctl, racc, rctl = free_ports(4)
    master = [
        "master",
        "--accounting",
        v6(acc),
        "--control",
        v6(ctl),
        "--rule",
        "api:1/m:1",
        "--stats-interval",
        "0",
    ]
    router = [
        "router",
        "--accounting",
        v6(racc),
        "--control",
        v6(rctl),
        "--master",
        f"{v6(acc)},{v6(ctl)}",
    ]
    with (
        smockron_proc(master, tmp_path / "master.log") as mproc,
        smockron_proc(router, tmp_path / "router.log") as rproc,
    ):
        wait_for(lambda: "router: accounting" in rproc.log(), 15)
        # ::1 is loopback: no --insecure-bind needed (two processes: the master may log
        # it after the router has started)
        wait_for(lambda: "loopback only" in mproc.log(), 15)
        gk = Gatekeeper(v6(racc), v6(rctl), ["api"])
        try:
            assert delayed(gk, 15)
        finally:
            gk.close()


@pytest.mark.parametrize(
    ("endpoints", "ipv6"),
    [
        (("tcp://[::1]:1",), True),
        (("tcp://[fe80::1%eth0]:1",), True),
        (("tcp://eth0;[::1]:1",), True),
        (("tcp://127.0.0.1:1", "tcp://[::1]:2"), True),
        (("tcp://127.0.0.1:1",), False),
        (("tcp://localhost:1",), False),  # a name keeps IPv4: the peer may listen on 127.0.0.1
        (("tcp://*:1",), False),
        (("ipc:///tmp/x",), False),
    ],
)
def test_ipv6_is_set_for_ipv6_addresses_only(endpoints: tuple[str, ...], ipv6: bool) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    try:
        allow_ipv6(sock, *endpoints)
        assert sock.getsockopt(zmq.IPV6) == int(ipv6)
    finally:
        sock.close(0)
        ctx.term()
