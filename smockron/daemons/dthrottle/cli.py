"""``smockron dthrottle``: the DThrottle daemon's command line."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
from pathlib import Path
from typing import Any

import click

from smockron import runtime
from smockron.daemons.dthrottle.clock import Clock, FileClock
from smockron.daemons.dthrottle.config import DThrottleConfig
from smockron.daemons.dthrottle.server import DThrottleDaemon
from smockron.errors import ConfigError
from smockron.settings import (
    Duration,
    SmockronCommand,
    metrics_option,
    print_settings_if_asked,
    source_of,
)

log = logging.getLogger("smockron.dthrottle")

MIN_STATS_INTERVAL = 0.01
MAX_STATS_INTERVAL = 86400.0


def _raise_fd_limit() -> None:
    """Thousands of client connections need thousands of descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _stats_interval(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """A negative or NaN interval would make the stats loop log without pause."""
    if not (value == 0 or MIN_STATS_INTERVAL <= value <= MAX_STATS_INTERVAL):
        raise click.BadParameter(
            f"must be 0 (off) or {MIN_STATS_INTERVAL:g}..{MAX_STATS_INTERVAL:g} seconds, "
            f"got {value}"
        )
    return value


@click.command(
    cls=SmockronCommand,
    file_format=None,  # DThrottle's own TOML layout, read by DThrottleConfig
    legacy_env=True,  # SMOCKRON_DTHROTTLE_PEERS as well as ..._PEER
    context_settings={"help_option_names": ["-h", "--help"], "show_default": False},
)
@click.option(
    "--config",
    "config_file",
    envvar="SMOCKRON_DTHROTTLE_CONFIG",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML file with any of these settings (flags and environment win); reloaded "
    "on SIGHUP. See docs/daemons.md.",
)
@click.option(
    "--listen",
    multiple=True,
    metavar="tcp:HOST:PORT|unix:PATH",
    help="Where to answer queries; repeatable. "
    "[default: tcp:127.0.0.1:6969 and unix:/tmp/dthrottle.sock]",
)
@click.option("--burst", metavar="N", help="Bucket capacity in tokens.  [default: 10]")
@click.option(
    "--rate",
    metavar="RATE",
    help="Refill, tokens per second (or RATE/UNIT like 60/m).  [default: 1.0]",
)
@click.option(
    "--report-interval",
    metavar="DURATION",
    help="Time between peer reports, 1s..1h (a bare number is seconds).  [default: 5s]",
)
@click.option(
    "--rule",
    "rules",
    multiple=True,
    nargs=3,
    metavar="PREFIX BURST RATE",
    help="Tags starting with PREFIX get their own burst and rate; the longest "
    "matching prefix wins. Repeatable.",
)
@click.option(
    "--whitelist",
    multiple=True,
    metavar="PREFIX",
    help="Tags starting with PREFIX are always OK. Repeatable.",
)
@click.option(
    "--peer",
    "peers",
    multiple=True,
    metavar="HOST:PORT",
    help="Send reports to this peer over UDP unicast. Repeatable.",
)
@click.option(
    "--peer-bind",
    metavar="HOST:PORT",
    help="UDP address for peers' unicast reports.  [default: 0.0.0.0:6969 with --peer]",
)
@click.option(
    "--multicast",
    metavar="GROUP:PORT",
    help="Exchange reports over UDP multicast, e.g. 239.255.69.69:6969.",
)
@click.option(
    "--multicast-interface",
    metavar="IP",
    help="Interface address for multicast.  [default: 0.0.0.0]",
)
@click.option("--multicast-ttl", metavar="N", help="Multicast hops.  [default: 1]")
@click.option(
    "--max-tag-length",
    metavar="BYTES",
    help="Longest tag in bytes; a longer line closes that connection.  [default: 256]",
)
@click.option(
    "--max-datagram", metavar="BYTES", help="Largest report datagram in bytes.  [default: 1400]"
)
@click.option(
    "--max-entries",
    metavar="N",
    help="Most buckets kept; at the limit the fullest of the oldest are evicted (counted, "
    "logged).  [default: 1000000]",
)
@click.option(
    "--stats-interval",
    type=Duration(),
    default="60s",
    callback=_stats_interval,
    show_default=True,
    help="Time between counter log lines (10ms..1d; a bare number is seconds); 0 turns them off.",
)
@click.option(
    "--test-clock-file",
    type=click.Path(dir_okay=False, path_type=Path),
    hidden=True,
    help="Test only: read the time from this file instead of the monotonic clock.",
)
@metrics_option()
def dthrottle(
    config_file: Path | None, test_clock_file: Path | None, stats_interval: float, **flags: Any
) -> None:
    """DThrottle: collective throttling of requests over a group of onlines.

    Send a throttling tag and a newline; the answer is exactly "OK\\n" (serve it) or
    "NO\\n" (throttle it). Pipelining is fine. Each tag has a bucket of BURST tokens
    refilled at RATE per second; an OK takes a token. Every REPORT-INTERVAL seconds
    each daemon tells its peers (--peer or --multicast) how many requests it served per
    tag, and the peers take those tokens too. SIGUSR1 sends a report at once;
    SIGHUP reloads the --config file's rules; SIGTERM or SIGINT stops cleanly.

    Every flag may also come from an environment variable SMOCKRON_DTHROTTLE_<NAME>
    (BURST, RATE, LISTEN, PEERS, WHITELIST, CONFIG, ...; lists separated by spaces).
    Flags win over the environment, which wins over the --config file.
    """
    metrics = flags.pop("metrics")
    flags["rule"] = [{"prefix": p, "burst": b, "rate": r} for p, b, r in flags.pop("rules")]
    config = _config(config_file, flags)
    print_settings_if_asked({**vars_of(config), "stats_interval": stats_interval})
    clock: Clock | None = FileClock(test_clock_file) if test_clock_file else None
    _raise_fd_limit()
    daemon = DThrottleDaemon(
        config, clock=clock, stats_every=stats_interval or None, metrics=metrics
    )

    def reload() -> None:
        daemon.reconfigure(DThrottleConfig.from_sources(config_file, flags))

    async def main(stop: asyncio.Event) -> None:
        try:
            await daemon.start()
        except (OSError, ConfigError) as exc:
            raise click.ClickException(f"cannot start: {exc}") from None
        runtime.startup_line("dthrottle", listen=",".join(daemon.addresses), peers=_peers(config))
        await stop.wait()
        await daemon.stop()
        log.info("dthrottle stopped after %d queries", daemon.stats.queries)

    runtime.run(
        main,
        name="dthrottle",
        reload=reload if config_file is not None else None,
        extra_signals={signal.SIGUSR1: daemon.report_now},
    )


def _config(file: Path | None, flags: dict[str, Any]) -> DThrottleConfig:
    """The settings; a bad value's error names where it came from (flag, variable, file),
    found by leaving each source out in turn."""
    try:
        return DThrottleConfig.from_sources(file, flags)
    except ConfigError as exc:
        error = exc
    ctx = click.get_current_context()
    params = {p.name: p for p in ctx.command.params}
    for key, value in flags.items():
        if value in (None, (), []) or key not in params:
            continue
        if _loads(file, {k: v for k, v in flags.items() if k != key}):
            raise ConfigError(f"{source_of(ctx, params[key])}: {error}")
    if file is not None and _loads(None, flags):
        raise ConfigError(f"{file}: {error}")
    raise error


def _loads(file: Path | None, flags: dict[str, Any]) -> bool:
    try:
        DThrottleConfig.from_sources(file, flags)
    except ConfigError:
        return False
    return True


def vars_of(config: DThrottleConfig) -> dict[str, Any]:
    return {f: getattr(config, f) for f in config.__dataclass_fields__}


def _peers(config: DThrottleConfig) -> str:
    if config.multicast is not None:
        return "multicast"
    return "unicast" if config.peers else "none"
