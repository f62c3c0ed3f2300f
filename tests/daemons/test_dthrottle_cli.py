"""Two real `smockron dthrottle` processes replay the seed's worked example exactly.

The daemons run on a file clock (the hidden --test-clock-file option): every reading of
time, including when the next report is due, comes from a file this test writes, so
"t=5" is the moment the test writes 5.0 and both daemons report.
"""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

import pytest

from smockron.daemons.dthrottle.clock import set_file_clock
from tests.support import free_ports, smockron_proc, smockron_run, wait_for, wait_port


def ask(port: int, tags: list[bytes]) -> bytes:
    """A client as the seed describes it: tag + newline, read exactly three bytes each."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"".join(tag + b"\n" for tag in tags))
        out = b""
        while len(out) < 3 * len(tags):
            chunk = s.recv(4096)
            assert chunk, f"connection closed after {out!r}"
            out += chunk
        return out


def daemon_args(
    tcp: int, udp: int, peer_udp: int, *extra: str, burst: str, rate: str, report: str
) -> list[str]:
    """A dthrottle serving on ``tcp``, reporting over UDP from ``udp`` to a peer's."""
    return [
        "--log-level",
        "DEBUG",
        "dthrottle",
        "--listen",
        f"tcp:127.0.0.1:{tcp}",
        "--burst",
        burst,
        "--rate",
        rate,
        "--report-interval",
        report,
        "--peer",
        f"127.0.0.1:{peer_udp}",
        "--peer-bind",
        f"127.0.0.1:{udp}",
        *extra,
    ]


def test_seed_example_with_two_real_daemons(tmp_path: Path) -> None:
    clock = tmp_path / "clock"
    set_file_clock(clock, 0.0)
    tcp_a, tcp_b, udp_a, udp_b = free_ports(4)

    def seed(tcp: int, udp: int, peer: int) -> list[str]:
        clocked = ["--test-clock-file", str(clock), "--stats-interval", "0"]
        return daemon_args(tcp, udp, peer, *clocked, burst="10", rate="1.0", report="5")

    with (
        smockron_proc(seed(tcp_a, udp_a, udp_b), tmp_path / "a.log") as a,
        smockron_proc(seed(tcp_b, udp_b, udp_a), tmp_path / "b.log") as b,
    ):
        wait_port(tcp_a)
        wait_port(tcp_b)
        C = b"C"
        # t=0.1: 17 requests as fast as possible, 9 to A and 8 to B: all served
        assert ask(tcp_a, [C] * 9) == b"OK\n" * 9
        assert ask(tcp_b, [C] * 8) == b"OK\n" * 8
        # t=0.2: two more, both to A: A has 1 token left -> OK, then NO
        assert ask(tcp_a, [C, C]) == b"OK\nNO\n"
        # t=5: the daemons exchange reports (A: C 10, B: C 8) and subtract them
        set_file_clock(clock, 5.0)
        wait_for(lambda: "applied report 1 part 1/1" in a.log(), timeout=10)
        wait_for(lambda: "applied report 1 part 1/1" in b.log(), timeout=10)
        assert "sent report 1: 1 tags" in a.log() and "sent report 1: 1 tags" in b.log()
        # t=5.2: both buckets are at -3 (+0.2): two more requests, both denied
        set_file_clock(clock, 5.2)
        assert ask(tcp_a, [C]) == b"NO\n"
        assert ask(tcp_b, [C]) == b"NO\n"
        # t=6, 7, 8: C backs off while the buckets refill to -2, -1, 0
        for t in (6.0, 7.0, 8.0):
            set_file_clock(clock, t)
            assert ask(tcp_a, [C]) == b"NO\n", t
            assert ask(tcp_b, [C]) == b"NO\n", t
        # t=9: one token on each online: one request served, the next refused
        set_file_clock(clock, 9.0)
        assert ask(tcp_a, [C, C]) == b"OK\nNO\n"
        assert ask(tcp_b, [C, C]) == b"OK\nNO\n"
        assert a.stop(signal.SIGTERM) == 0 and b.stop(signal.SIGINT) == 130
    for proc in (a, b):
        assert "Traceback" not in proc.log()


def test_config_file_with_rules_whitelist_and_unix_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tcp,) = free_ports(1)
    sock = tmp_path / "dt.sock"
    conf = tmp_path / "dthrottle.toml"
    conf.write_text(
        f'listen = ["tcp:127.0.0.1:{tcp}", "unix:{sock}"]\n'
        'burst = 1\nrate = "1/h"\nreport_interval = 2\n'
        'whitelist = ["ops:"]\n'
        '[[rule]]\nprefix = "api:"\nburst = 3\nrate = 1.0\n'
    )
    with smockron_proc(
        ["dthrottle", "--config", str(conf), "--burst", "2"], tmp_path / "d.log"
    ) as d:
        wait_port(tcp)
        assert ask(tcp, [b"x"] * 3) == b"OK\nOK\nNO\n"  # --burst 2 overrides the file's 1
        assert ask(tcp, [b"api:k"] * 4) == b"OK\nOK\nOK\nNO\n"
        assert ask(tcp, [b"ops:k"] * 4) == b"OK\n" * 4
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(sock))
            s.sendall(b"x\nx\n")  # the same bucket as over TCP: empty (a new one: OK, OK)
            assert s.recv(6) == b"NO\nNO\n"
        assert d.stop(signal.SIGTERM) == 0
    assert not sock.exists()


def test_bad_settings_fail_with_a_clear_message(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return smockron_run(["dthrottle", *args])

    out = run("--report-interval", "0")
    assert out.returncode == 2 and "report interval must be 1..3600 s, got 0" in out.stderr
    out = run("--listen", "udp:1.2.3.4:5")
    assert out.returncode == 2 and "--listen must be tcp:HOST:PORT or unix:PATH" in out.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("burst = 10\nbrust = 3\n")
    out = run("--config", str(bad))
    assert out.returncode == 2 and "unknown DThrottle setting(s): brust" in out.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run("--listen", f"tcp:127.0.0.1:{port}")
    assert out.returncode == 1 and "cannot start:" in out.stderr
    assert "Traceback" not in out.stderr
    not_a_socket = tmp_path / "plain-file"
    not_a_socket.write_text("keep me")
    out = run("--listen", f"unix:{not_a_socket}")
    assert out.returncode == 1 and "exists and is not a socket" in out.stderr
    assert not_a_socket.read_text() == "keep me"


def test_sigusr1_sends_a_report_at_once(tmp_path: Path) -> None:
    tcp_a, tcp_b, udp_a, udp_b = free_ports(4)

    def args(tcp: int, udp: int, peer: int) -> list[str]:
        return daemon_args(tcp, udp, peer, burst="5", rate="1/h", report="3600")

    with (
        smockron_proc(args(tcp_a, udp_a, udp_b), tmp_path / "a.log") as a,
        smockron_proc(args(tcp_b, udp_b, udp_a), tmp_path / "b.log") as b,
    ):
        wait_port(tcp_a)
        wait_port(tcp_b)
        assert ask(tcp_a, [b"k"] * 4) == b"OK\n" * 4
        a.popen.send_signal(signal.SIGUSR1)
        wait_for(lambda: "applied report 1 part 1/1" in b.log(), timeout=10)
        # 5 - 4 from A's report = 1 token (and the sliver refilled since, rate 1/h, is
        # no second one): without the report B would serve all 5
        assert ask(tcp_b, [b"k"] * 5) == b"OK\nNO\nNO\nNO\nNO\n"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("-1", "cannot parse duration"),
        ("nan", "cannot parse duration"),
        ("1e9", "cannot parse duration"),
        ("0.001", "must be 0 (off) or 0.01..86400"),
        ("1ms", "must be 0 (off) or 0.01..86400"),
        ("2d", "must be 0 (off) or 0.01..86400"),
    ],
)
def test_a_stats_interval_that_would_flood_the_log_is_refused(value: str, why: str) -> None:
    from click.testing import CliRunner

    from smockron.daemons.dthrottle.cli import dthrottle

    result = CliRunner().invoke(dthrottle, ["--stats-interval", value])
    assert result.exit_code == 2
    assert f"Invalid value for '--stats-interval': {why}" in result.output


def test_environment_wins_over_the_file_and_flags_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tcp,) = free_ports(1)
    conf = tmp_path / "dthrottle.toml"
    conf.write_text('burst = 1\nrate = "1/h"\nwhitelist = ["file:"]\n')
    # smockron_env() copies os.environ: the daemon process sees these
    monkeypatch.setenv("SMOCKRON_DTHROTTLE_CONFIG", str(conf))
    monkeypatch.setenv("SMOCKRON_DTHROTTLE_BURST", "3")  # beats the file's 1
    monkeypatch.setenv("SMOCKRON_DTHROTTLE_RATE", "1/s")  # loses to the flag
    monkeypatch.setenv("SMOCKRON_DTHROTTLE_LISTEN", f"tcp:127.0.0.1:{tcp}")
    monkeypatch.setenv("SMOCKRON_DTHROTTLE_WHITELIST", "env: ops:")  # a list: spaces
    args = ["dthrottle", "--rate", "1/h", "--stats-interval", "0"]
    with smockron_proc(args, tmp_path / "d.log") as d:
        wait_port(tcp)
        assert ask(tcp, [b"x"] * 4) == b"OK\nOK\nOK\nNO\n"
        assert ask(tcp, [b"env:a", b"env:a", b"ops:b", b"ops:b"]) == b"OK\n" * 4
        assert ask(tcp, [b"file:c"] * 4) == b"OK\nOK\nOK\nNO\n"  # the env list replaced it
        assert d.stop(signal.SIGTERM) == 0
    assert "burst 3, rate 0.000277778/s, 0 rules, 2 whitelisted" in d.log()


def test_rules_whitelist_tag_limit_and_multicast_as_flags(tmp_path: Path) -> None:
    tcp, group_port = free_ports(2)
    unix = tmp_path / "d.sock"
    args = [
        "--log-level",
        "DEBUG",
        "dthrottle",
        "--listen",
        f"tcp:127.0.0.1:{tcp}",
        "--listen",
        f"unix:{unix}",
        "--burst",
        "1",
        "--rate",
        "1/h",
        "--stats-interval",
        "0",
        "--rule",
        "api:",
        "3",
        "1/h",
        "--rule",
        "api:vip:",
        "5",
        "1/h",
        "--whitelist",
        "ops:",
        "--whitelist",
        "10.",
        "--max-tag-length",
        "8",
        "--multicast",
        f"239.255.69.71:{group_port}",
        "--multicast-interface",
        "127.0.0.1",
        "--max-datagram",
        "600",
    ]
    with smockron_proc(args, tmp_path / "d.log") as d:
        wait_port(tcp)
        assert ask(tcp, [b"api:a"] * 4) == b"OK\n" * 3 + b"NO\n"
        assert ask(tcp, [b"api:vip:"] * 6) == b"OK\n" * 5 + b"NO\n"
        assert ask(tcp, [b"ops:x", b"ops:x", b"10.1", b"10.1"]) == b"OK\n" * 4
        assert ask(tcp, [b"z", b"z"]) == b"OK\nNO\n"
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(unix))
            # the same buckets on both listeners: empty (a fresh bucket of 5 would answer
            # OK twice)
            s.sendall(b"api:vip:\napi:vip:\nops:x\n")
            assert s.recv(9) == b"NO\nNO\nOK\n"
        with socket.create_connection(("127.0.0.1", tcp), timeout=5) as s:
            s.sendall(b"123456789\n")  # 9 bytes > --max-tag-length 8: closed, no answer
            assert s.recv(10) == b""
        d.popen.send_signal(signal.SIGUSR1)
        wait_for(lambda: "sent report 1: 3 tags in 1 datagrams" in d.log(), timeout=10)
        assert d.stop(signal.SIGTERM) == 0
    log = d.log()
    assert f"multicast reports on 239.255.69.71:{group_port} via 127.0.0.1" in log
    assert not unix.exists()
    assert "2 rules, 2 whitelisted" in log and "line longer than the 8-byte tag limit" in log


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rule", "api:", "many", "1"], "rule burst must be an integer"),
        (["--rule", "api:", "3", "0"], "rate must be > 0"),
        (["--whitelist", "a", "--rule", "a", "1", "1"], "configured twice"),
        (["--max-tag-length", "0"], "max_tag_length must be in 1..65535, got 0"),
        (["--multicast", "239.1.1.1"], "multicast must be HOST:PORT"),
    ],
)
def test_bad_flags_are_refused_before_listening(args: list[str], message: str) -> None:
    from click.testing import CliRunner

    from smockron.daemons.dthrottle.cli import dthrottle

    result = CliRunner().invoke(dthrottle, args)
    assert result.exit_code == 2, result.output  # a usage error, like any bad value
    assert message in result.output
