"""smockron's member-list gossip against hashicorp/memberlist itself: a Go member built
from Debian's golang-github-hashicorp-memberlist-dev (memberlist_node.go, set up as
Gubernator's member-list pool sets up its own) and two ``smockron cluster`` processes
configured by Gubernator's variables form one cluster, as Gubernator and smockron nodes
do during a rolling migration.

scripts/test installs Go and the library (apt: golang-go,
golang-github-hashicorp-memberlist-dev); elsewhere the test is skipped, naming them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import Proc, free_ports, run_smockron, stopping, wait_for, wait_port

GOPATH = Path("/usr/share/gocode")
SOURCE = Path(__file__).with_name("memberlist_node.go")


@pytest.fixture(scope="module")
def go_member(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Go member, built once."""
    library = GOPATH / "src/github.com/hashicorp/memberlist"
    if shutil.which("go") is None or not library.is_dir():
        pytest.skip(
            "needs Go and hashicorp/memberlist (apt: golang-go "
            "golang-github-hashicorp-memberlist-dev; scripts/test installs them)"
        )
    out = tmp_path_factory.mktemp("go") / "memberlist_node"
    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": str(GOPATH),
        "GOCACHE": str(out.parent / "cache"),
        "GOFLAGS": "",
    }
    subprocess.run(["go", "build", "-o", str(out), str(SOURCE)], env=env, check=True, timeout=300)
    return out


def _health(http: int) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/v1/HealthCheck", timeout=5) as resp:
        return json.loads(resp.read())


def _grpc_peers(http: int) -> set[str]:
    return {p["grpc_address"] for p in _health(http)["local_peers"]}


class GoMember:
    """The Go member as a process: the members it last printed, its log."""

    def __init__(self, binary: Path, port: int, grpc: str, known: str, log: Path) -> None:
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            [str(binary), "go-member", str(port), grpc, "60", known],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self.members: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline()
        if line:  # "null" while it knows no member
            self.members = json.loads(line) or []
        return self.members

    def leave(self) -> None:
        """Close its stdin: it leaves the member list (memberlist's Leave) and exits."""
        assert self.popen.stdin is not None
        self.popen.stdin.close()
        self.popen.wait(10)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        self._log.close()


@pytest.fixture
def cluster(
    go_member: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[GoMember, list[Proc], list[int], list[str]]]:
    """smockron a, the Go member (joining a) and smockron b (knowing only the Go member)."""
    ga, ha, ma, gb, hb, mb, go_port = free_ports(7)
    procs: list[Proc] = []
    member = None
    with stopping(procs):
        try:
            for name, g, h, m, known in (("a", ga, ha, ma, go_port), ("b", gb, hb, mb, go_port)):
                for var, value in {
                    "GUBER_GRPC_ADDRESS": f"127.0.0.1:{g}",
                    "GUBER_HTTP_ADDRESS": f"127.0.0.1:{h}",
                    "GUBER_MEMBERLIST_ADDRESS": f"127.0.0.1:{m}",
                    "GUBER_MEMBERLIST_KNOWN_NODES": f"127.0.0.1:{known}",
                    "GUBER_MEMBERLIST_NODE_NAME": f"smockron-{name}",
                }.items():
                    monkeypatch.setenv(var, value)
                procs.append(run_smockron(["cluster"], tmp_path / f"{name}.log"))
                if name == "a":
                    wait_port(ha)
                    member = GoMember(
                        go_member, go_port, "127.0.0.1:1", f"127.0.0.1:{ma}", tmp_path / "go.log"
                    )
            wait_port(hb)
            assert member is not None
            yield member, procs, [ha, hb], [f"127.0.0.1:{ga}", f"127.0.0.1:{gb}"]
        finally:
            if member is not None:
                member.stop()


@pytest.mark.slow
def test_smockron_nodes_and_a_hashicorp_memberlist_member_form_one_cluster(
    cluster: tuple[GoMember, list[Proc], list[int], list[str]],
) -> None:
    member, procs, https, grpcs = cluster
    everyone = {*grpcs, "127.0.0.1:1"}
    # b knows only the Go member: it learns of a through memberlist's push/pull and gossip
    wait_for(lambda: all(_grpc_peers(h) == everyone for h in https), 20)
    wait_for(lambda: len(member.poll()) == 3, 20)
    metas = {m["name"]: json.loads(m["meta"]) for m in member.members}
    assert {metas["smockron-a"]["grpc-address"], metas["smockron-b"]["grpc-address"]} == set(grpcs)
    assert metas["go-member"] == {
        "data-center": "",
        "http-address": "",
        "grpc-address": "127.0.0.1:1",
    }
    member.leave()  # a graceful leave, as a Gubernator pod's shutdown: dropped at once
    wait_for(lambda: all(_grpc_peers(h) == set(grpcs) for h in https), 10)
    go_log = member.log_path.read_text(errors="replace")
    assert "[ERR]" not in go_log, go_log[-3000:]  # memberlist read everything we sent
    for proc in procs:
        assert "malformed" not in proc.log().lower(), proc.log()[-3000:]
