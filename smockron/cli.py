"""The ``smockron`` command.

Subcommands are loaded lazily: each front end defines its own click command in
``smockron/<front>/cli.py``, so ``smockron jarl`` never imports gRPC or ZeroMQ code
it does not need, and a missing optional extra only breaks the command that needs it.
"""

from __future__ import annotations

import importlib
import logging
import os

import click

# name -> "module:attribute" of a click.Command
COMMANDS: dict[str, str] = {
    "master": "smockron.master.cli:master",
    "router": "smockron.master.cli:router",
    "proxy": "smockron.gatekeeper.cli:proxy",
    "demo": "smockron.demo:demo",
    "cluster": "smockron.cluster.cli:cluster",
    "jarl": "smockron.daemons.jarl.cli:jarl",
    "dthrottle": "smockron.daemons.dthrottle.cli:dthrottle",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported only when invoked or listed in help."""

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
    default=lambda: os.environ.get("SMOCKRON_LOG_LEVEL", "INFO"),
    show_default="INFO or $SMOCKRON_LOG_LEVEL",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="Logging threshold.",
)
@click.version_option(package_name="smockron")
def main(log_level: str) -> None:
    """Smockron: a distributed rate limiter.

    Run `smockron demo` to see a master and two gatekeepers hold an abusive client
    to its rule while a well-behaved one passes untouched.
    """
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
