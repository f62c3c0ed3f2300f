"""``smockron master`` and ``smockron router``: flags in, objects built, loop run."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import click

from smockron import runtime
from smockron.curve import InsecureBindError, bind_mode
from smockron.curve_cli import Refused, curve_options
from smockron.errors import ConfigError, SmockronError
from smockron.master.config import DEFAULT_ACCOUNTING, DEFAULT_CONTROL, MasterSettings
from smockron.master.config import load_settings as _load_settings
from smockron.settings import (
    Duration,
    SmockronCommand,
    ZmqAddress,
    check_zmq_address,
    metrics_option,
    print_settings_if_asked,
)
from smockron.wire.codec import DEFAULT_LIMITS

log = logging.getLogger("smockron.master")


async def _until_stopped(
    run: Callable[[], Coroutine[Any, Any, None]],
    stop_server: Callable[[], None],
    stop: asyncio.Event,
) -> None:
    """Run a server's own ``run`` and call its ``stop`` when the runtime says so."""
    serving = asyncio.create_task(run())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if stopping.done():
        stop_server()
    stopping.cancel()
    try:
        await serving
    except InsecureBindError as exc:
        raise Refused(str(exc)) from None
    except SmockronError as exc:
        raise click.ClickException(str(exc)) from None
    except Exception as exc:
        if type(exc).__name__ == "ZMQError":
            raise click.ClickException(f"cannot bind: {exc}") from None
        raise


def _refuse_open_binds(endpoints: tuple[str, str], clients: str | None, insecure: bool) -> None:
    """Before anything starts: a non-loopback bind without keys is a usage error (one
    line, exit 2) unless ``--insecure-bind`` (the process checks again when it binds)."""
    try:
        bind_mode(endpoints, 0 if clients else None, insecure)
    except InsecureBindError as exc:
        raise Refused(str(exc)) from None


@click.command(cls=SmockronCommand, file_format=None)  # reads its own TOML or YAML
@click.option(
    "--config",
    "config",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML file (or the original master's YAML); reloaded on SIGHUP.",
)
@click.option(
    "--accounting",
    type=ZmqAddress(),
    help=f"SUB address for accounting [default: {DEFAULT_ACCOUNTING}]",
)
@click.option(
    "--control", type=ZmqAddress(), help=f"PUB address for control [default: {DEFAULT_CONTROL}]"
)
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
    help="Per domain: history (default: the original Smockron's history rule, a request "
    "known late charged as debt), history-literal (that rule exactly as the original "
    "states it) or gcra (the original master's GCRA). Repeatable.",
)
@click.option(
    "--store",
    help="memory:// (default), redis://HOST:PORT/DB, redis+sentinel://HOST:PORT,.../SERVICE "
    "or redis+cluster://HOST:PORT,...",
)
@click.option(
    "--snapshot",
    type=click.Path(dir_okay=False),
    metavar="PATH",
    help="memory:// only: keep the states in this file (written periodically and on "
    "shutdown, read at start).",
)
@click.option(
    "--snapshot-interval",
    type=Duration(),
    metavar="DURATION",
    help="How often the snapshot is written [default: 30s].",
)
@metrics_option()
@click.option(
    "--stats-interval",
    type=Duration(),
    metavar="DURATION",
    help="Log a statistics line this often (0: never; a bare number is seconds) [default: 60s].",
)
@click.option(
    "--skew-tolerance",
    type=Duration(),
    metavar="DURATION",
    help="Timestamps farther than this from the master's clock are replaced by it [default: 2].",
)
@click.option(
    "--hwm", type=click.IntRange(min=1), help="ZeroMQ high-water mark, messages [default: 100000]."
)
@click.option(
    "--queue", type=click.IntRange(min=1), help="Internal queue bound, messages [default: 100000]."
)
@click.option(
    "--batch", type=click.IntRange(min=1), help="Messages processed in one go [default: 2000]."
)
@click.option(
    "--max-identifier",
    type=click.IntRange(min=1),
    metavar="BYTES",
    help=f"Longest identifier [default: {DEFAULT_LIMITS.max_identifier}].",
)
@click.option(
    "--max-domain",
    type=click.IntRange(min=1),
    metavar="BYTES",
    help=f"Longest domain [default: {DEFAULT_LIMITS.max_domain}].",
)
@click.option(
    "--max-loginfo",
    type=click.IntRange(min=1),
    metavar="BYTES",
    help=f"Longest log info [default: {DEFAULT_LIMITS.max_loginfo}].",
)
@click.option(
    "--peer",
    "peers",
    multiple=True,
    metavar="ACC_ADDR,CTL_ADDR",
    help="Another master of this master's fleet. Repeatable; none: a fleet of one.",
)
@click.option(
    "--advertise",
    metavar="ACC_ADDR,CTL_ADDR",
    help="How the fleet names this master [default: --accounting,--control].",
)
@click.option(
    "--replicas",
    type=click.IntRange(min=1),
    help="Masters of the fleet that hold each identifier [default: 2].",
)
@curve_options("master", server=True, client=False)
def master(
    config: Path | None,
    rules: tuple[str, ...],
    algorithms: tuple[str, ...],
    **overrides: Any,
) -> None:
    """Run the Smockron master: apply rules to accounting, publish DELAY_UNTIL.

    Every flag may also come from SMOCKRON_MASTER_<FLAG>; then the --config file
    (TOML, or the original Smockron master's YAML; reloaded on SIGHUP); then defaults.
    """
    from smockron.master.server import Master

    def load() -> MasterSettings:
        return _load_settings(config, overrides=overrides, rules=rules, algorithms=algorithms)

    settings = load()
    print_settings_if_asked(
        {
            **{name: getattr(settings, name) for name in settings.__dataclass_fields__},
            "config": str(config) if config else None,
        }
    )
    _refuse_open_binds(
        (settings.accounting, settings.control), settings.curve_clients, settings.insecure_bind
    )
    try:
        server = Master(settings, reload=load if config is not None else None)
    except ConfigError:
        raise
    except SmockronError as exc:
        raise click.ClickException(str(exc)) from None

    async def main(stop: asyncio.Event) -> None:
        runtime.startup_line(
            "master",
            store=settings.store,
            domains=len(settings.domains),
            config=str(config) if config else "none",
            curve="on" if settings.curve_secret else "off",
        )
        await _until_stopped(lambda: server.run(handle_signals=False), server.stop, stop)

    runtime.run(main, name="master", reload=server.reload)


@click.command(cls=SmockronCommand)
@click.option(
    "--accounting",
    type=ZmqAddress(),
    default=DEFAULT_ACCOUNTING,
    show_default=True,
    help="SUB address the gatekeepers publish accounting to.",
)
@click.option(
    "--control",
    type=ZmqAddress(),
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
    "--shard-by",
    type=click.Choice(["domain", "identifier"]),
    default="domain",
    show_default=True,
    help="domain: each domain to one master (the original Smockron's rule). identifier: "
    "each message to the masters holding its identifier's shard (masters peered with "
    "--peer); RESYNCs to every master.",
)
@click.option(
    "--hwm",
    type=int,
    default=100_000,
    show_default=True,
    help="ZeroMQ high-water mark of every socket.",
)
@curve_options("router", server=True, client=True)
@metrics_option()
def router(
    accounting: str,
    control: str,
    masters: tuple[str, ...],
    shard_by: str,
    hwm: int,
    curve_secret: str | None,
    curve_clients: str | None,
    curve_server: str | None,
    insecure_bind: bool | None,
    metrics: str | None,
) -> None:
    """Shard accounting over several masters, by domain or by identifier; relay their
    control, with one publish counter per domain for them all.

    Every flag may also come from SMOCKRON_ROUTER_<FLAG> or a --config TOML file. With
    CURVE, the gatekeepers' keys are checked against --curve-clients, and the masters
    (which allow this router's key) are pinned by --curve-server.
    """
    from smockron.curve import curve_client
    from smockron.curve import curve_server as server_curve
    from smockron.master.router import MasterAddress, Router

    print_settings_if_asked(
        {
            "accounting": accounting,
            "control": control,
            "masters": masters,
            "shard_by": shard_by,
            "hwm": hwm,
            "curve_secret": curve_secret,
            "curve_clients": curve_clients,
            "curve_server": curve_server,
            "insecure_bind": insecure_bind,
            "metrics": metrics,
        }
    )
    if curve_secret is not None and curve_clients is None and curve_server is None:
        raise ConfigError("--curve-secret needs --curve-clients, --curve-server or both")
    try:
        targets = [MasterAddress.parse(spec) for spec in masters]
        for spec in masters:
            for address in spec.split(","):
                check_zmq_address(address.strip())
    except SmockronError as exc:
        raise ConfigError(f"--master: {exc}") from None
    _refuse_open_binds((accounting, control), curve_clients, bool(insecure_bind))
    try:
        server = Router(
            accounting,
            control,
            targets,
            shard_by=shard_by,
            hwm=hwm,
            curve_server=server_curve(curve_secret, curve_clients) if curve_clients else None,
            curve_client=curve_client(curve_secret, curve_server) if curve_server else None,
            insecure_bind=bool(insecure_bind),
            metrics=metrics,
        )
    except SmockronError as exc:
        raise click.ClickException(str(exc)) from None

    async def main(stop: asyncio.Event) -> None:
        runtime.startup_line(
            "router",
            accounting=accounting,
            control=control,
            masters=len(targets),
            shard_by=shard_by,
            curve="on" if curve_secret else "off",
        )
        await _until_stopped(lambda: server.run(handle_signals=False), server.stop, stop)

    runtime.run(main, name="router", reload=server.reload)
