"""``smockron jarl``: the JARL command line, flag for flag."""

from __future__ import annotations

import asyncio
import logging

import click

from smockron import runtime
from smockron.daemons.jarl.algorithm import Jarl
from smockron.daemons.jarl.server import JarlServer
from smockron.errors import ConfigError, SmockronError
from smockron.settings import SmockronCommand, metrics_option, print_settings_if_asked, reread

log = logging.getLogger("smockron.jarl")


def _at_least_one(ctx: click.Context, param: click.Parameter, value: int) -> int:
    """Refuse 0 and negatives with a message that says why, not just a range."""
    if value < 1:
        flag = param.opts[0]
        raise click.BadParameter(
            f"{flag} must be at least 1, got {value}: "
            "a rate limit of zero requests or a zero-second period means nothing to wait for"
        )
    return value


@click.command(cls=SmockronCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--service",
    required=True,
    help="Name of the service to rate-limit; only a label for logs and ps.",
)
@click.option(
    "--requests",
    "requests_",
    required=True,
    type=int,
    callback=_at_least_one,
    help="Maximum number of requests to allow within the period (>= 1).",
)
@click.option(
    "--period",
    required=True,
    type=int,
    callback=_at_least_one,
    help="Period to enforce the rate over, in whole seconds (>= 1).",
)
@click.option("--ip", required=True, help="IPv4 interface to bind to, normally 0.0.0.0.")
@click.option("--port", required=True, type=click.IntRange(0, 65535), help="Port to bind to.")
@click.option(
    "--log-counts/--no-log-counts",
    default=False,
    show_default=True,
    help="Log a line every minute with the connections answered and delayed.",
)
@metrics_option()
def jarl(
    service: str,
    requests_: int,
    period: int,
    ip: str,
    port: int,
    log_counts: bool,
    metrics: str | None,
) -> None:
    """JARL - Just A Rate Limiter: how long must I wait before calling SERVICE?

    Every TCP connection gets, without sending anything, the number of seconds to wait
    before calling the service, with three decimals and no newline ("0.000" means go
    now), and is then closed. One queue and one counter for the whole process: the first
    REQUESTS connections in any PERIOD get 0.000; later ones get the time until the
    oldest of them ages out plus PERIOD/REQUESTS (at least 0.01 s) per caller already
    waiting. SIGTERM or SIGINT stops the server cleanly.

    Every flag may also come from SMOCKRON_JARL_<FLAG> or a --config TOML file.

    \b
    Example:
      smockron jarl --service PaymentGateway --period 1 --requests 100 \\
        --ip 0.0.0.0 --port 1234
    """
    print_settings_if_asked(
        {
            "service": service,
            "requests": requests_,
            "period": period,
            "ip": ip,
            "port": port,
            "log_counts": log_counts,
            "metrics": metrics,
        }
    )
    server = JarlServer(
        Jarl(requests_, period),
        ip,
        port,
        service=service,
        log_every=60.0 if log_counts else None,
        metrics=metrics,
    )

    async def main(stop: asyncio.Event) -> None:
        try:
            await server.start()
        except OSError as exc:
            raise click.ClickException(f"cannot listen on {ip}:{port}: {exc}") from None
        except SmockronError as exc:  # the --metrics listener
            await server.stop()
            raise click.ClickException(str(exc)) from None
        runtime.startup_line("jarl", listen=f"{ip}:{server.port}")
        await stop.wait()
        await server.stop()

    def reload() -> None:
        """SIGHUP: --requests and --period read again (flags, environment, --config)."""
        try:
            new = reread(click.get_current_context())
            server.jarl = server.jarl.retuned(new["requests_"], new["period"])
        except ConfigError as exc:
            log.error("reload failed, keeping the running limit: %s", exc)
            return
        running = {"service": service, "ip": ip, "port": port}
        fixed = [k for k, v in running.items() if new[k] != v]
        if fixed:
            log.warning("reload: %s changed but need a restart; kept", ", ".join(fixed))
        runtime.log_stats(
            log, {"requests": new["requests_"], "period": new["period"]}, event="reloaded"
        )

    runtime.run(main, name="jarl", reload=reload)
