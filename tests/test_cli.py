"""The `smockron` command: lazy subcommands and clear errors."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from smockron.cli import COMMANDS, main
from tests.support import smockron_run


def test_help_lists_every_subcommand() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for name in COMMANDS:
        assert name in result.output


def test_unknown_subcommand_fails_cleanly() -> None:
    result = CliRunner().invoke(main, ["no-such-command"])
    assert result.exit_code == 2
    assert "No such command" in result.output


def test_python_dash_m_entry_point() -> None:
    out = smockron_run(["--version"])
    assert out.returncode == 0, out.stderr
    assert "smockron" in out.stdout and "0.1.0" in out.stdout


def _smockron(*args: str) -> subprocess.CompletedProcess[str]:
    return smockron_run(args, 30)


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_startup_failures_are_one_line(busy_port: int) -> None:
    """A busy port or a bad address is one line naming it, not a traceback."""
    cases = [
        (
            [
                "proxy",
                "--listen",
                f"127.0.0.1:{busy_port}",
                "--upstream",
                "http://127.0.0.1:9",
                "--domain",
                "api",
            ],
            f"cannot listen on 127.0.0.1:{busy_port}",
            1,
        ),
        (
            [
                "proxy",
                "--listen",
                "127.0.0.1:1",
                "--upstream",
                "http://127.0.0.1:9",
                "--domain",
                "api",
                "--accounting",
                "garbage",
            ],
            "'--accounting': ZeroMQ address 'garbage'",
            2,
        ),
        (
            [
                "master",
                "--rule",
                "a:1/s:1",
                "--accounting",
                "tcp://127.0.0.1:0",
                "--control",
                "tcp://127.0.0.1:0",
                "--metrics",
                f"127.0.0.1:{busy_port}",
            ],
            f"cannot serve metrics on 127.0.0.1:{busy_port}",
            1,
        ),
    ]
    for args, message, code in cases:
        out = _smockron(*args)
        assert out.returncode == code, (args, out.stderr)
        assert message in out.stderr and "Traceback" not in out.stderr, out.stderr
