"""``smockron proxy``: run a gatekeeper reverse proxy in front of an HTTP service."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
from collections.abc import Coroutine
from typing import Any

import click

from smockron.core.rules import ALGORITHMS, parse_rule_spec
from smockron.curve import curve_client
from smockron.curve_cli import curve_options
from smockron.errors import ConfigError
from smockron.gatekeeper.core import AsyncGatekeeper
from smockron.gatekeeper.httpgate import HttpGate, http_loginfo
from smockron.gatekeeper.identify import parse_identify
from smockron.gatekeeper.proxy import GatekeeperProxy

log = logging.getLogger("smockron.gatekeeper.cli")

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_MS = {"ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0, "d": 86_400_000.0,
            None: 1000.0}  # fmt: skip


def parse_duration_ms(text: str) -> int:
    """``2s``, ``500ms``, ``1.5s``, ``1m``, ``1h``, ``1d`` or bare seconds (``5``) as ms."""
    match = _DURATION_RE.match(text)
    if match is None:
        raise ConfigError(f"cannot parse duration {text!r}: use e.g. 2s, 500ms or 1m")
    return round(float(match.group(1)) * _UNIT_MS[match.group(2)])


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"cannot parse --listen {text!r}: expected HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def rule_config(rules: tuple[str, ...], algorithms: tuple[str, ...]) -> dict[str, list[str]]:
    """``--rule`` and ``--algorithm`` flags as a gatekeeper's ``rules`` argument."""
    config: dict[str, list[str]] = {}
    for spec in rules:
        domain, _rule = parse_rule_spec(spec)  # validates
        config.setdefault(domain, []).append(spec.split(":", 1)[1])
    for spec in algorithms:
        domain, sep, algorithm = spec.partition("=")
        if not sep or algorithm not in ALGORITHMS:
            raise ConfigError(f"cannot parse --algorithm {spec!r}: expected DOMAIN=history|gcra")
        if domain not in config:
            raise ConfigError(f"--algorithm given for domain {domain!r}, which has no --rule")
        config[domain].insert(0, algorithm)
    return config


@click.command()
@click.option("--listen", required=True, help="HOST:PORT to serve on, e.g. 127.0.0.1:8080.")
@click.option(
    "--upstream", required=True, help="The protected service, e.g. http://127.0.0.1:9000."
)
@click.option("--domain", required=True, help="The Smockron domain of every request.")
@click.option("--accounting", default="tcp://127.0.0.1:10004", show_default=True)
@click.option("--control", default="tcp://127.0.0.1:10005", show_default=True)
@click.option("--identify", default="ip", show_default=True, help="ip or header:NAME.")
@click.option(
    "--trusted-proxy",
    multiple=True,
    help="Address or CIDR whose X-Forwarded-For / Forwarded is believed (repeatable).",
)
@click.option(
    "--max-delay", default="5s", show_default=True, help="Longest delay before rejecting."
)
@click.option(
    "--max-delayed", default=1000, show_default=True, help="Most requests waiting at once."
)
@click.option(
    "--reject-status", type=click.Choice(["503", "429"]), default="503", show_default=True
)
@click.option(
    "--reject-sample",
    type=click.FloatRange(0.0, 1.0),
    default=1.0,
    show_default=True,
    help="Fraction of rejections reported to the master.",
)
@click.option("--loginfo/--no-loginfo", default=True, help="Send User-Agent and Referer.")
@click.option(
    "--decision-header/--no-decision-header",
    default=False,
    help="Add X-Smockron-Decision: accept|delay|reject to responses.",
)
@click.option(
    "--max-ahead",
    default="1d",
    show_default=True,
    help="Refuse a DELAY_UNTIL further ahead than this (e.g. 1h, 1d): whatever holds the "
    "control port cannot block a client for longer.",
)
@click.option(
    "--rule",
    "rules",
    multiple=True,
    metavar="DOMAIN:RATE/UNIT:BURST",
    help="The domain's rule, as the master's --rule (repeatable): the first line holds "
    "each client to it on this proxy's own traffic until the master offers its rules.",
)
@click.option(
    "--algorithm",
    "algorithms",
    multiple=True,
    metavar="DOMAIN=ALG",
    help="The algorithm of --rule's domain, as the master's: history (default) or gcra.",
)
@click.option(
    "--master-rules/--no-master-rules",
    default=True,
    show_default=True,
    help="Take the rules the master offers (they replace --rule).",
)
@click.option(
    "--stats-interval",
    type=float,
    default=60.0,
    show_default=True,
    help="Log the gatekeeper's counters this often, in seconds (0: never).",
)
@curve_options("proxy", server=False, client=True)
@click.option("--metrics", metavar="HOST:PORT", help="Serve /metrics, /healthz, /readyz here.")
def proxy(
    listen: str,
    upstream: str,
    domain: str,
    accounting: str,
    control: str,
    identify: str,
    trusted_proxy: tuple[str, ...],
    max_delay: str,
    max_delayed: int,
    reject_status: str,
    reject_sample: float,
    loginfo: bool,
    decision_header: bool,
    max_ahead: str,
    rules: tuple[str, ...],
    algorithms: tuple[str, ...],
    master_rules: bool,
    stats_interval: float,
    curve_secret: str | None,
    curve_server: str | None,
    metrics: str | None,
) -> None:
    """Run a gatekeeper reverse proxy in front of UPSTREAM."""
    try:
        host, port = parse_listen(listen)
        max_delay_ms = parse_duration_ms(max_delay)
        gate = HttpGate(
            domain,
            parse_identify(identify, trusted_proxy),
            http_loginfo if loginfo else None,
            int(reject_status),
        )
        gatekeeper = AsyncGatekeeper(
            accounting,
            control,
            gate.domains,
            max_delay_ms=max_delay_ms,
            max_delayed=max_delayed,
            reject_sample=reject_sample,
            rules=rule_config(rules, algorithms),
            master_rules=master_rules,
            max_ahead_ms=parse_duration_ms(max_ahead),
            curve=curve_client(curve_secret, curve_server),
        )
        server = GatekeeperProxy(
            upstream, gate, gatekeeper, decision_header=decision_header, metrics=metrics
        )
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    run(serve(server, host, port, stats_interval))


async def serve(server: GatekeeperProxy, host: str, port: int, stats_interval: float) -> None:
    """Serve until SIGTERM or SIGINT, then close cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start(host, port)
    except OSError as exc:
        await server.close()
        raise click.ClickException(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None
    except ConfigError as exc:  # the --metrics listener
        await server.close()
        raise click.ClickException(str(exc)) from None
    try:
        while True:
            try:
                await asyncio.wait_for(stop.wait(), stats_interval if stats_interval > 0 else None)
                break
            except TimeoutError:
                log.info("stats %s", server.stats())
    finally:
        log.info("stopping; stats %s", server.stats())
        await server.close()


def run(coro: Coroutine[Any, Any, None]) -> None:
    """Run on uvloop when it is installed (it roughly doubles proxy throughput)."""
    with contextlib.suppress(KeyboardInterrupt):
        try:
            import uvloop
        except ImportError:
            asyncio.run(coro)
        else:
            uvloop.run(coro)
