"""``smockron keygen``, and the CURVE options every control-plane command shares."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from smockron.curve import keygen as write_keys
from smockron.errors import ConfigError


@click.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.argument("name")
def keygen(directory: Path, name: str) -> None:
    """Write NAME.key (public) and NAME.key_secret (secret, mode 0600) in DIRECTORY.

    Give the master's NAME.key to every gatekeeper (--curve-server) and copy each
    gatekeeper's NAME.key into the master's --curve-clients directory; a .key_secret
    file never leaves its host."""
    try:
        public, secret = write_keys(directory, name)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"public key: {public}")
    click.echo(f"secret key: {secret} (mode 0600)")


class Refused(click.ClickException):
    """A non-loopback bind without keys: one line, exit status 2 (a usage error)."""

    exit_code = 2


def curve_options(command: str, *, server: bool, client: bool) -> Callable[[Any], Any]:
    """``--curve-secret`` and, for a binding side, ``--curve-clients`` and
    ``--insecure-bind``; for a connecting side ``--curve-server``."""
    env = f"SMOCKRON_{command.upper()}_"
    options = [
        click.option(
            "--curve-secret",
            envvar=env + "CURVE_SECRET",
            metavar="FILE",
            help="This process's CURVE secret key (.key_secret from `smockron keygen`).",
        ),
    ]
    if server:
        options += [
            click.option(
                "--curve-clients",
                envvar=env + "CURVE_CLIENTS",
                metavar="DIR",
                help="Directory of the allowed gatekeepers' public keys (*.key).",
            ),
            click.option(
                "--insecure-bind",
                envvar=env + "INSECURE_BIND",
                is_flag=True,
                default=None,
                help="Allow a non-loopback address without CURVE keys.",
            ),
        ]
    if client:
        options.append(
            click.option(
                "--curve-server",
                envvar=env + "CURVE_SERVER",
                metavar="FILE",
                help="The master's public key (.key): pinned, so no other process "
                "can pose as the master.",
            ),
        )

    def decorate(f: Any) -> Any:
        for option in reversed(options):
            f = option(f)
        return f

    return decorate
