"""``smockron top`` against a live master that received traffic."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from smockron.observe.top import WIDTH, render
from tests.master.client import FakeGatekeeper
from tests.observe.endpoints import sample
from tests.support import (
    REPO_ROOT,
    free_ports,
    master_args,
    smockron_env,
    smockron_proc,
    wait_for,
    wait_port,
)

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def busy_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, FakeGatekeeper]]:
    """A master with two domains; bob is throttled, carol (with a hostile name) too."""
    acc, ctl, met = free_ports(3)
    args = master_args(acc, ctl, rules=["api:1/s:2", "login:1/s:1", "probe:1/s:1"], metrics=met)
    log = tmp_path_factory.mktemp("top") / "master.log"
    with smockron_proc(args, log), FakeGatekeeper(acc, ctl) as gk:
        wait_port(met)
        gk.handshake()
        for _ in range(7):
            gk.accepted("api", b"bob")
        for _ in range(3):
            gk.accepted("login", b"carol\x1b[2J[bold]")
        wait_for(
            lambda: (
                (
                    sample(met, "smockron_master_messages_total", domain="login", status="accepted")
                    or 0
                )
                >= 3
            )
        )
        yield met, gk


def top_once(met: int, interval: float = 0.2) -> subprocess.Popen[str]:
    env = {**smockron_env(), "COLUMNS": "160", "TERM": "dumb"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "smockron",
            "top",
            f"127.0.0.1:{met}",
            "--once",
            "--interval",
            str(interval),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO_ROOT,
    )


def test_once_renders_domains_rates_counts_and_top_identifiers(
    busy_master: tuple[int, FakeGatekeeper],
) -> None:
    met, gk = busy_master
    before = sample(met, "smockron_master_messages_total", domain="api", status="accepted") or 0
    proc = top_once(met, interval=1.0)
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:  # traffic all along its life
        gk.accepted("api", b"dave")
        time.sleep(0.05)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "\x1b" not in out  # the hostile identifier's escape is shown, not sent
    assert max(len(line.rstrip()) for line in out.splitlines()) <= WIDTH, out
    # per domain: "api  per s  accepted delayed rejected DELAY_UNTILs", then "total ..."
    rows = re.findall(r"^ ?(\S*) +(per s|total) +(\S+) +(\S+) +(\S+) +(\S+)\s*$", out, re.M)
    rates = {name: [float(v) for v in row[1:]] for name, *row in rows if row[0] == "per s"}
    totals = [[int(v) for v in row[2:]] for row in rows if row[1] == "total"]
    names = [name for name, kind, *_ in rows if kind == "per s"]
    assert names == ["api", "login", "probe"] and len(totals) == 3, out
    by_name = dict(zip(names, totals, strict=True))
    wait_for(
        lambda: (
            (sample(met, "smockron_master_messages_total", domain="api", status="accepted") or 0)
            > before
        )
    )
    after = sample(met, "smockron_master_messages_total", domain="api", status="accepted") or 0
    assert before < by_name["api"][0] <= after, out
    assert rates["api"][0] > 0, out  # accepted per second: ~20 sent per second
    assert by_name["login"][0] == 3 and rates["login"][0] == 0, out
    assert by_name["login"][3] == 3, out  # carol's 3 DELAY_UNTILs (rule 1/s:1)
    assert "DELAY_UNTILs sent per identifier" in out
    assert re.search(r"^ ?api +(bob|dave) +\d+\s*$", out, re.M), out
    assert "carol\\x1b[2J[bold]" in out  # escaped, and not taken as markup


def test_a_frame_fits_80_columns_at_any_figures() -> None:
    """Long domain names and identifiers are cut, counts past 7 digits get a unit: every
    row of a frame stays on one line of an 80-column terminal."""
    domains = {
        f"checkout-api-{i}-with-a-long-name": {
            "accepted": 123_456_789 * i,
            "delayed": 98_765_432,
            "rejected": 7,
            "published": 99_999_999,
        }
        for i in range(1, 4)
    }
    before = {"time": 0.0, "domains": {}}
    after = {
        "time": 0.5,
        "domains": domains,
        "top_window_s": 60,
        "top": {"checkout-api-1-with-a-long-name": [("203.0.113.7-" + "x" * 80, 12_345)]},
    }
    console = Console(width=WIDTH, record=True)
    console.print(render(before, after, "127.0.0.1:9100"))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= WIDTH, text
    assert len(re.findall(r"per s", text)) == 3 and len(re.findall(r" total ", text)) == 3
    assert "741M" in text and "…" in text and "12345" in text, text


def test_unreachable_master_is_one_line_exit_1() -> None:
    (port,) = free_ports(1)
    proc = top_once(port)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert err.startswith("smockron top: error: cannot read http://127.0.0.1:")
    assert "Traceback" not in err


def _drain(leader: int) -> bytes:
    """What the terminal has to read now (waiting 0.2 s at most for the first of it)."""
    out = b""
    while select.select([leader], [], [], 0.2)[0]:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child's side closed
            break
        if not chunk:
            break
        out += chunk
    return out


def test_live_view_in_a_pty(busy_master: tuple[int, FakeGatekeeper], tmp_path: Path) -> None:
    """The live view as a terminal shows it; Ctrl-C ends it with 130 and no traceback."""
    leader, follower = os.openpty()
    env = {**smockron_env(), "COLUMNS": "150", "LINES": "40", "TERM": "xterm-256color"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "smockron",
            "top",
            f"127.0.0.1:{busy_master[0]}",
            "--interval",
            "0.3",
        ],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=env,
        cwd=REPO_ROOT,
        start_new_session=True,
    )
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (b"bob" in seen and b"login" in seen):
            if select.select([leader], [], [], 0.2)[0]:
                seen += os.read(leader, 65536)
        text = ANSI.sub(b"", seen).decode(errors="replace")
        assert "api" in text and "login" in text and "bob" in text, text
        os.killpg(proc.pid, signal.SIGINT)
        # read on while it ends: a view blocked writing to a full terminal never would
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            seen += _drain(leader)
        assert proc.wait(1) == 130
        seen += _drain(leader)
        assert b"Traceback" not in seen
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        os.close(leader)
