"""``smockron proxy``: run a gatekeeper reverse proxy in front of an HTTP service."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import click

from smockron import runtime
from smockron.core.rules import ALGORITHMS, parse_rule_spec
from smockron.curve import curve_client
from smockron.curve_cli import curve_options
from smockron.errors import ConfigError
from smockron.gatekeeper._asyncio import AsyncGatekeeper
from smockron.gatekeeper._firstline import first_lines
from smockron.gatekeeper.httpgate import HttpGate, http_loginfo
from smockron.gatekeeper.identify import parse_identify
from smockron.gatekeeper.proxy import GatekeeperProxy
from smockron.settings import (
    Duration,
    HostPort,
    SmockronCommand,
    ZmqAddress,
    metrics_option,
    parse_duration_ms,
    parse_listen,
    parse_master,
    print_settings_if_asked,
    reread,
)

log = logging.getLogger("smockron.gatekeeper.cli")

__all__ = ["parse_duration_ms", "parse_listen", "proxy", "rule_config"]


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


@click.command(cls=SmockronCommand)
@click.option(
    "--listen",
    required=True,
    type=HostPort(listen=True),
    help="HOST:PORT to serve on, e.g. 127.0.0.1:8080.",
)
@click.option(
    "--upstream", required=True, help="The protected service, e.g. http://127.0.0.1:9000."
)
@click.option("--domain", required=True, help="The Smockron domain of every request.")
@click.option("--accounting", type=ZmqAddress(), default="tcp://127.0.0.1:10004", show_default=True)
@click.option("--control", type=ZmqAddress(), default="tcp://127.0.0.1:10005", show_default=True)
@click.option(
    "--master",
    "masters",
    multiple=True,
    metavar="ACC_ADDR,CTL_ADDR",
    help="A master of a fleet (repeatable: every master of the fleet); replaces "
    "--accounting/--control.",
)
@click.option("--identify", default="ip", show_default=True, help="ip or header:NAME.")
@click.option(
    "--trusted-proxy",
    multiple=True,
    help="Address or CIDR whose X-Forwarded-For / Forwarded is believed (repeatable).",
)
@click.option(
    "--max-delay",
    type=Duration(unit="ms"),
    default="5s",
    show_default=True,
    help="Longest delay before rejecting (a bare number is seconds).",
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
    type=Duration(unit="ms"),
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
    help="--rule's algorithm, as the master's: history (default), history-literal or gcra.",
)
@click.option(
    "--master-rules/--no-master-rules",
    default=True,
    show_default=True,
    help="Take the rules the master offers (they replace --rule).",
)
@click.option(
    "--stats-interval",
    type=Duration(),
    default="60s",
    show_default=True,
    help="Log the gatekeeper's counters this often (a bare number is seconds; 0: never).",
)
@click.option(
    "--header-timeout",
    type=Duration(),
    default="10s",
    show_default=True,
    help="Close a connection whose request headers are not complete this long after it "
    "opened (slow or idle clients).",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=None,
    help="Open client connections at most; at the cap the longest idle one is closed "
    "[what the descriptor limit allows, two per connection].",
)
@curve_options("proxy", server=False, client=True)
@metrics_option()
def proxy(
    listen: str,
    upstream: str,
    domain: str,
    accounting: str,
    control: str,
    masters: tuple[str, ...],
    identify: str,
    trusted_proxy: tuple[str, ...],
    max_delay: float,
    max_delayed: int,
    reject_status: str,
    reject_sample: float,
    loginfo: bool,
    decision_header: bool,
    max_ahead: float,
    rules: tuple[str, ...],
    algorithms: tuple[str, ...],
    master_rules: bool,
    stats_interval: float,
    header_timeout: float,
    max_connections: int | None,
    curve_secret: str | None,
    curve_server: str | None,
    metrics: str | None,
) -> None:
    """Run a gatekeeper reverse proxy in front of UPSTREAM.

    Every flag may also come from SMOCKRON_PROXY_<FLAG> or a --config TOML file.
    """
    print_settings_if_asked({k: v for k, v in locals().items() if not k.startswith("_")})
    host, port = parse_listen(listen)
    try:
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
            max_delay_ms=round(max_delay),
            max_delayed=max_delayed,
            reject_sample=reject_sample,
            rules=rule_config(rules, algorithms),
            master_rules=master_rules,
            max_ahead_ms=round(max_ahead),
            curve=curve_client(curve_secret, curve_server),
            masters=[parse_master(spec) for spec in masters],
        )
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    server = GatekeeperProxy(
        upstream,
        gate,
        gatekeeper,
        decision_header=decision_header,
        metrics=metrics,
        header_timeout_s=header_timeout,
        max_connections=max_connections,
    )
    running = {k: v for k, v in locals().items() if k in _PARAMS}
    runtime.run(
        lambda stop: serve(server, host, port, stats_interval, stop),
        name="proxy",
        reload=_reloader(click.get_current_context(), gatekeeper, running),
    )


_RELOADABLE = ("max_delay", "max_delayed", "reject_sample", "max_ahead", "rules", "algorithms")
"""What SIGHUP changes in a running proxy; the rest (addresses, identification, keys)
needs a restart."""
_PARAMS = (
    *_RELOADABLE,
    "listen",
    "upstream",
    "domain",
    "accounting",
    "control",
    "masters",
    "identify",
    "trusted_proxy",
    "reject_status",
    "loginfo",
    "decision_header",
    "master_rules",
    "stats_interval",
    "curve_secret",
    "curve_server",
    "metrics",
    "header_timeout",
    "max_connections",
)


def _reloader(
    ctx: click.Context, gatekeeper: AsyncGatekeeper, running: dict[str, Any]
) -> Callable[[], None]:
    """SIGHUP: the settings read again (flags, environment, the config file); the
    reloadable ones applied, the others reported; a bad file changes nothing."""

    def reload() -> None:
        try:
            new = reread(ctx)
            lines = first_lines(rule_config(new["rules"], new["algorithms"]))
        except ConfigError as exc:
            log.error("reload failed, keeping the running settings: %s", exc)
            return
        fixed = sorted(k for k in _PARAMS if k not in _RELOADABLE and new.get(k) != running[k])
        if fixed:
            log.warning("reload: %s changed but need a restart; kept", ", ".join(fixed))
        decider = gatekeeper.decider
        decider.max_delay_ms, decider.max_delayed = round(new["max_delay"]), new["max_delayed"]
        decider.table.max_ahead_ms = round(new["max_ahead"])
        gatekeeper.reject_sample = new["reject_sample"]
        old = first_lines(rule_config(running["rules"], running["algorithms"]))
        for domain in old.keys() - lines.keys():
            decider.set_line(domain, None)
        for domain, line in lines.items():
            decider.set_line(domain, line)
        running.update({k: new[k] for k in _RELOADABLE})
        runtime.log_stats(log, {k: running[k] for k in _RELOADABLE}, event="reloaded")

    return reload


async def serve(
    server: GatekeeperProxy, host: str, port: int, stats_interval: float, stop: asyncio.Event
) -> None:
    """Serve until ``stop`` (SIGTERM, SIGINT), logging stats, then close cleanly."""
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
    runtime.startup_line(
        "proxy",
        listen=f"{host}:{port}",
        upstream=server.upstream,
        accounting=server.gatekeeper.accounting or "none",
        masters=len(server.gatekeeper.masters),
        curve="on" if server.gatekeeper.curve is not None else "off",
    )
    try:
        while True:
            try:
                await asyncio.wait_for(stop.wait(), stats_interval if stats_interval > 0 else None)
                break
            except TimeoutError:
                runtime.log_stats(log, _flat(server.stats()))
    finally:
        runtime.log_stats(log, _flat(server.stats()), event="stopping")
        await server.close()


def _flat(stats: Mapping[str, Any]) -> dict[str, Any]:
    """A stats mapping, nested mappings flattened to ``outer_inner`` keys."""
    out: dict[str, Any] = {}
    for key, value in stats.items():
        if isinstance(value, Mapping):
            out.update({f"{key}_{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out
