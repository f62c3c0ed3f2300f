"""``smockron master`` and ``smockron router``: flags in, objects built, loop run."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import click

from smockron.curve import InsecureBindError
from smockron.curve_cli import Refused, curve_options
from smockron.errors import ConfigError, SmockronError
from smockron.master.config import DEFAULT_ACCOUNTING, DEFAULT_CONTROL, MasterSettings
from smockron.master.config import load_settings as _load_settings

log = logging.getLogger("smockron.master")


def _run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """uvloop when installed (faster event loop), plain asyncio otherwise."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())


@click.command()
@click.option(
    "--config",
    "config",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML file (or the original master's YAML); reloaded on SIGHUP.",
)
@click.option("--accounting", help=f"SUB address for accounting [default: {DEFAULT_ACCOUNTING}]")
@click.option("--control", help=f"PUB address for control [default: {DEFAULT_CONTROL}]")
@click.option(
    "--rule",
    "rules",
    multiple=True,
    metavar="DOMAIN:RATE/UNIT:BURST",
    help="A rule, e.g. api:10/s:20. Repeatable; several per domain.",
)
@click.option(
    "--algorithm",
    "algorithms",
    multiple=True,
    metavar="DOMAIN=ALG",
    help="history (default, the seed's rule) or gcra, per domain. Repeatable.",
)
@click.option("--store", help="memory:// (default) or redis://HOST:PORT/DB")
@click.option("--metrics", metavar="HOST:PORT", help="Serve Prometheus metrics here.")
@click.option(
    "--stats-interval",
    type=float,
    metavar="SECONDS",
    help="Log a statistics line this often (0: never) [default: 60].",
)
@click.option(
    "--skew-tolerance",
    type=float,
    metavar="SECONDS",
    help="Timestamps farther than this from the master's clock are replaced by it [default: 2].",
)
@click.option("--hwm", type=int, help="ZeroMQ high-water mark, messages [default: 100000].")
@click.option("--queue", type=int, help="Internal queue bound, messages [default: 100000].")
@click.option("--batch", type=int, help="Messages processed in one go [default: 2000].")
@click.option(
    "--max-identifier", type=int, metavar="BYTES", help="Longest identifier [default: 1024]."
)
@click.option("--max-domain", type=int, metavar="BYTES", help="Longest domain [default: 256].")
@click.option("--max-loginfo", type=int, metavar="BYTES", help="Longest log info [default: 8192].")
@curve_options("master", server=True, client=False)
def master(
    config: Path | None,
    rules: tuple[str, ...],
    algorithms: tuple[str, ...],
    **overrides: Any,
) -> None:
    """Run the Smockron master: apply rules to accounting, publish DELAY_UNTIL."""
    from smockron.master.server import Master

    def load() -> MasterSettings:
        return _load_settings(config, overrides=overrides, rules=rules, algorithms=algorithms)

    try:
        settings = load()
        server = Master(settings, reload=load if config is not None else None)
    except SmockronError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        _run(server.run)
    except InsecureBindError as exc:
        raise Refused(str(exc)) from None
    except SmockronError as exc:
        raise click.ClickException(str(exc)) from None
    except Exception as exc:
        if type(exc).__name__ == "ZMQError":
            raise click.ClickException(f"cannot bind: {exc}") from None
        raise


@click.command()
@click.option(
    "--accounting",
    default=DEFAULT_ACCOUNTING,
    show_default=True,
    help="SUB address the gatekeepers publish accounting to.",
)
@click.option(
    "--control",
    default=DEFAULT_CONTROL,
    show_default=True,
    help="PUB address the gatekeepers subscribe to for control.",
)
@click.option(
    "--master",
    "masters",
    multiple=True,
    required=True,
    metavar="ACC_ADDR,CTL_ADDR",
    help="A master's accounting and control addresses. Repeatable.",
)
@click.option(
    "--hwm",
    type=int,
    default=100_000,
    show_default=True,
    help="ZeroMQ high-water mark of every socket.",
)
@curve_options("router", server=True, client=True)
@click.option("--metrics", metavar="HOST:PORT", help="Serve /metrics, /healthz, /readyz here.")
def router(
    accounting: str,
    control: str,
    masters: tuple[str, ...],
    hwm: int,
    curve_secret: str | None,
    curve_clients: str | None,
    curve_server: str | None,
    insecure_bind: bool | None,
    metrics: str | None,
) -> None:
    """Shard accounting over several masters by domain; relay all their control.

    With CURVE, the gatekeepers' keys are checked against --curve-clients, and the
    masters (which allow this router's key) are pinned by --curve-server."""
    from smockron.curve import curve_client
    from smockron.curve import curve_server as server_curve
    from smockron.master.router import MasterAddress, Router

    try:
        if curve_secret is not None and curve_clients is None and curve_server is None:
            raise ConfigError("--curve-secret needs --curve-clients, --curve-server or both")
        targets = [MasterAddress.parse(spec) for spec in masters]
        server = Router(
            accounting,
            control,
            targets,
            hwm=hwm,
            curve_server=server_curve(curve_secret, curve_clients) if curve_clients else None,
            curve_client=curve_client(curve_secret, curve_server) if curve_server else None,
            insecure_bind=bool(insecure_bind),
            metrics=metrics,
        )
    except SmockronError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        _run(server.run)
    except InsecureBindError as exc:
        raise Refused(str(exc)) from None
    except SmockronError as exc:
        raise click.ClickException(str(exc)) from None
