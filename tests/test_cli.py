"""The `smockron` command: lazy subcommands and clear errors."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from smockron.cli import COMMANDS, main
from tests.support import smockron_env


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
    out = subprocess.run(
        [sys.executable, "-m", "smockron", "--version"],
        capture_output=True,
        text=True,
        env=smockron_env(),
        timeout=60,
        check=True,
    )
    assert "smockron" in out.stdout and "0.1.0" in out.stdout
