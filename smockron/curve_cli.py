"""``smockron keygen``: the CURVE key pairs of masters, routers and gatekeepers."""

from __future__ import annotations

from pathlib import Path

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
