"""The ``smockron`` command.

Subcommands are loaded lazily: each front end defines its own click command in
``smockron/<front>/cli.py``, so ``smockron jarl`` never imports gRPC or ZeroMQ code
it does not need, and a missing optional extra only breaks the command that needs it.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from smockron.errors import ConfigError
from smockron.settings import LOG_FORMATS, LOG_LEVELS

# name -> "module:attribute" of a click.Command
COMMANDS: dict[str, str] = {
    "master": "smockron.master.cli:master",
    "router": "smockron.master.cli:router",
    "proxy": "smockron.gatekeeper.cli:proxy",
    "demo": "smockron.demo:demo",
    "cluster": "smockron.cluster.cli:cluster",
    "jarl": "smockron.daemons.jarl.cli:jarl",
    "dthrottle": "smockron.daemons.dthrottle.cli:dthrottle",
    "keygen": "smockron.curve_cli:keygen",
    "top": "smockron.observe.top:top",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported only when invoked or listed in help.

    Every failure ends the same way: a usage error (a bad flag, variable or file value)
    is one line and exit 2; a startup failure (a busy port...) one line and exit 1;
    Ctrl-C one line and exit 130. Never a traceback for any of them.
    """

    def main(  # type: ignore[override]
        self, args: Sequence[str] | None = None, prog_name: str | None = None, **extra: Any
    ) -> NoReturn:
        argv = list(sys.argv[1:] if args is None else args)
        try:
            code = super().main(argv, prog_name, standalone_mode=False, **extra)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            _die(_where(argv), exc.format_message(), 2)
        except click.ClickException as exc:
            _die(_where(argv), exc.format_message(), exc.exit_code)
        except ConfigError as exc:
            _die(_where(argv), str(exc), 2)
        except (KeyboardInterrupt, click.Abort):
            _die(_where(argv), "interrupted", 130)
        sys.exit(code if isinstance(code, int) else 0)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            return _unavailable(cmd_name, exc)
        command = getattr(module, attr)
        assert isinstance(command, click.Command)
        return command


def _where(argv: Sequence[str]) -> str:
    """``smockron SUBCOMMAND`` for the message, or ``smockron`` before one is named."""
    for arg in argv:
        if arg in COMMANDS:
            return f"smockron {arg}"
    return "smockron"


def _die(where: str, message: str, code: int) -> NoReturn:
    from smockron import runtime

    line = " ".join(message.split())  # one line, whatever the message held
    runtime.announce(f"{where}: error: {line}", logging.ERROR)
    sys.exit(code)


def _unavailable(name: str, exc: ImportError) -> click.Command:
    """A stand-in that keeps `smockron --help` working when one front end cannot load."""
    message = (
        f"'smockron {name}' is unavailable: {exc}. "
        "Install the extras it needs, e.g. pip install 'smockron[all]'."
    )

    def fail() -> None:
        raise click.ClickException(message)

    return click.Command(
        name, callback=fail, short_help="(unavailable: missing dependency)", help=message
    )


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--log-level",
    envvar="SMOCKRON_LOG_LEVEL",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    help="Logging threshold [SMOCKRON_LOG_LEVEL; INFO]; also after the subcommand.",
)
@click.option(
    "--log-format",
    envvar="SMOCKRON_LOG_FORMAT",
    type=click.Choice(LOG_FORMATS),
    help="text, or json (one object per line) [SMOCKRON_LOG_FORMAT; text].",
)
@click.version_option(package_name="smockron")
def main(log_level: str | None, log_format: str | None) -> None:
    """Smockron: a distributed rate limiter.

    Run `smockron demo` to see a master and two gatekeepers hold an abusive client
    to its rule while a well-behaved one passes untouched.

    Every command takes its settings from flags, then SMOCKRON_<COMMAND>_<OPTION>
    environment variables, then a TOML file (--config), then defaults; see
    docs/configuration.md.
    """
    from smockron import runtime

    runtime.configure_logging(log_level, log_format)
