"""``smockron master`` and ``smockron router``: flags in, objects built, loop run."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import click

from smockron import runtime
from smockron.errors import ConfigError, SmockronError
from smockron.master.config import DEFAULT_ACCOUNTING, DEFAULT_CONTROL, MasterSettings
from smockron.master.config import load_settings as _load_settings
from smockron.settings import (
    Duration,
    HostPort,
    SmockronCommand,
    ZmqAddress,
    check_zmq_address,
    print_settings_if_asked,
)

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
    except SmockronError as exc:
        raise click.ClickException(str(exc)) from None
    except Exception as exc:
        if type(exc).__name__ == "ZMQError":
            raise click.ClickException(f"cannot bind: {exc}") from None
        raise


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
    help="history (default, the seed's rule) or gcra, per domain. Repeatable.",
)
@click.option("--store", help="memory:// (default) or redis://HOST:PORT/DB")
@click.option(
    "--metrics",
    type=HostPort(listen=True),
    metavar="HOST:PORT",
    help="Serve Prometheus metrics here.",
)
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
    help="Longest identifier [default: 1024].",
)
@click.option(
    "--max-domain",
    type=click.IntRange(min=1),
    metavar="BYTES",
    help="Longest domain [default: 256].",
)
@click.option(
    "--max-loginfo",
    type=click.IntRange(min=1),
    metavar="BYTES",
    help="Longest log info [default: 8192].",
)
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
    from smockron.master.metrics import serve_metrics
    from smockron.master.server import Master

    def load() -> MasterSettings:
        return _load_settings(config, overrides=overrides, rules=rules, algorithms=algorithms)

    settings = load()
    print_settings_if_asked(
        {**{name: getattr(settings, name) for name in settings.__dataclass_fields__},
         "config": str(config) if config else None}
    )  # fmt: skip
    try:
        server = Master(settings, reload=load if config is not None else None)
    except ConfigError:
        raise
    except SmockronError as exc:
        raise click.ClickException(str(exc)) from None
    metrics = None
    if settings.metrics:
        try:
            metrics = serve_metrics(settings.metrics, server.stats, lambda: server.pending_count)
        except ConfigError as exc:  # a busy port: a startup failure, not a bad value
            raise click.ClickException(str(exc)) from None
        log.info("metrics on http://%s/metrics", settings.metrics)

    async def main(stop: asyncio.Event) -> None:
        runtime.startup_line("master", store=settings.store, domains=len(settings.domains),
                             config=str(config) if config else "none", tls="off")  # fmt: skip
        await _until_stopped(lambda: server.run(handle_signals=False), server.stop, stop)

    try:
        runtime.run(
            main,
            name="master",
            reload=server.reload if config is not None else None,
        )
    finally:
        if metrics is not None:
            with contextlib.suppress(Exception):
                metrics.shutdown()
                metrics.server_close()


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
    "--hwm",
    type=int,
    default=100_000,
    show_default=True,
    help="ZeroMQ high-water mark of every socket.",
)
def router(accounting: str, control: str, masters: tuple[str, ...], hwm: int) -> None:
    """Shard accounting over several masters by domain; relay all their control.

    Every flag may also come from SMOCKRON_ROUTER_<FLAG> or a --config TOML file.
    """
    from smockron.master.router import MasterAddress, Router

    print_settings_if_asked(
        {"accounting": accounting, "control": control, "masters": masters, "hwm": hwm}
    )
    try:
        targets = [MasterAddress.parse(spec) for spec in masters]
        for spec in masters:
            for address in spec.split(","):
                check_zmq_address(address.strip())
    except SmockronError as exc:
        raise ConfigError(f"--master: {exc}") from None
    try:
        server = Router(accounting, control, targets, hwm=hwm)
    except SmockronError as exc:
        raise click.ClickException(str(exc)) from None

    async def main(stop: asyncio.Event) -> None:
        runtime.startup_line("router", accounting=accounting, control=control,
                             masters=len(targets))  # fmt: skip
        await _until_stopped(lambda: server.run(handle_signals=False), server.stop, stop)

    runtime.run(main, name="router")
