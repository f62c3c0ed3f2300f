"""The original Smockron master's YAML configuration, read as it reads it.

* ``server.listen`` is ``[SCHEME://]HOST[:PORT]`` (default port 10004) and names the
  accounting socket; the control socket is on the port above it;
* ``datastore.host`` is the Redis as the original's client takes it,
  ``tcp://[DB:PASSWORD@]HOST[:PORT]`` (or ``localhost``, which it reads as 127.0.0.1);
* ``domains.NAME`` has ``rate`` (``3/sec``, ``3 per sec``, ``1/2s``) or ``interval``
  (``333ms``, a number of ms), and ``burst`` (a count, or a duration like ``2s``), turned
  into milliseconds with the original's arithmetic (``Math.round(period / count)``), and
  runs GCRA, the original's algorithm, unless ``algorithm`` says otherwise.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from smockron.core.rules import Rule, original_interval_ms, original_rate_interval_ms, parse_rate
from smockron.errors import ConfigError, RuleError
from smockron.master.domains import DomainPolicy
from smockron.master.rule_specs import domain_policy
from smockron.master.stores.uri import parse_store_uri

ORIGINAL_PORT = 10004
"""The original master's accounting port when ``server.listen`` names none."""
ORIGINAL_ALGORITHM = "gcra"
"""What a domain of the original's YAML runs unless it says otherwise."""
_ORIGINAL_KEYS = frozenset({"rate", "interval", "burst"})

log = logging.getLogger("smockron.master.config")


def yaml_settings(data: Any, path: Path) -> tuple[dict[str, Any], dict[str, DomainPolicy]]:
    """The settings (as ``MasterSettings`` keywords) and domains of an original YAML file."""
    file = repr(str(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: expected a mapping at the top level")
    if "socket" in data and "server" not in data:
        raise ConfigError(
            f"{file}: 'socket' is the UDP protocol of an unfinished branch of the original "
            "Smockron master; smockron speaks its ZeroMQ protocol: use server.listen"
        )
    values: dict[str, Any] = {}
    server = data.get("server") or {}
    if not isinstance(server, dict):
        raise ConfigError(f"{file}: 'server' must be a mapping")
    _warn_unread(data, server, file)
    if server.get("listen") is not None:
        values["accounting"], values["control"] = _listen_pair(server["listen"], file)
    if "datastore" in data:
        values["store"] = _datastore_uri(data["datastore"], file)
    raw = data.get("domains") or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: 'domains' must map domain names to rules")
    domains = {str(name): _yaml_domain(str(name), spec, file) for name, spec in raw.items()}
    return values, domains


def _warn_unread(data: dict[Any, Any], server: dict[Any, Any], file: str) -> None:
    """Settings of the file smockron does not read are named once at load, never dropped
    without a word (the original reads these three and ignores the rest)."""
    if "stats" in data:
        log.warning(
            "%s: 'stats' (the original master's statsd) is not read: smockron logs its "
            "statistics (--stats-interval) and serves Prometheus metrics (--metrics)",
            file,
        )
    if "datastore" not in data and os.environ.get("REDIS_URL"):
        log.warning(
            "%s: REDIS_URL is not read: the file's datastore or --store names the store "
            "(without either, the master keeps its state in memory)",
            file,
        )
    unread = sorted(str(k) for k in data if k not in ("server", "datastore", "domains", "stats"))
    unread += sorted(f"server.{k}" for k in server if k != "listen")
    if unread:
        log.warning(
            "%s: not read by the original master nor by smockron: %s", file, ", ".join(unread)
        )


# The original's Server._parseConnectionString, as written.
_LISTEN_RE = re.compile(r"(?:(\w+)://)?(.*?)(?::(\d+))?", re.ASCII)


def _listen_pair(listen: Any, file: str) -> tuple[str, str]:
    """``server.listen`` as the original reads it, ``[SCHEME://]HOST[:PORT]`` (scheme tcp
    and port 10004 by default), and the control address, on the port above it. A bare
    port (``10004``) is smockron's own spelling, for every interface."""
    where = f"{file}: server.listen {listen!r}"
    if isinstance(listen, int) and not isinstance(listen, bool):
        listen = str(listen)
    if not isinstance(listen, str):
        raise ConfigError(f"{where}: expected text such as '0.0.0.0' or 'tcp://*:10004'")
    if listen.isdigit() and listen.isascii():
        scheme, host, port = "tcp", "*", listen
    else:
        match = _LISTEN_RE.fullmatch(listen)
        if match is None:
            raise ConfigError(f"{where}: expected [tcp://]HOST[:PORT]")
        scheme, host, port = match.groups()
    if not host:
        raise ConfigError(f"{where} names no host: use '*' or '0.0.0.0' for every interface")
    number = ORIGINAL_PORT if port is None else int(port)
    if not 0 < number < 65535:
        raise ConfigError(f"{where}: port {number} (and {number + 1} for control) is out of range")
    base = f"{scheme or 'tcp'}://{host}"
    return f"{base}:{number}", f"{base}:{number + 1}"


def _datastore_uri(store: Any, file: str) -> str:
    """The store URI of ``datastore``: the original's ``{host: ...}``, or smockron's own
    spellings (a store URI, ``memory``/``redis``, ``{redis: {host, port, db}}``)."""
    where = f"{file}: datastore {store!r}"
    if isinstance(store, str):
        if store.split("://")[0] in ("memory", "redis", "rediss", "unix") and "://" in store:
            return _checked(store, where)
        if store in ("memory", "redis"):
            return "memory://" if store == "memory" else "redis://127.0.0.1:6379/0"
        if "://" in store:
            raise ConfigError(
                f"{where}: the original Smockron master takes its Redis as datastore.host; "
                f"write datastore: {{host: {store!r}}}, or a store URI such as redis://HOST:PORT/DB"
            )
    if isinstance(store, dict):
        if "redis" in store or store.get("type") == "redis":
            spec = store.get("redis", store)
            if isinstance(spec, dict) and "host" in spec:
                return _checked(_host_port_db(spec, where), where)
        elif store.get("type") == "memory":
            return "memory://"
        elif "host" in store or not store:
            return _checked(_original_datastore(store, where), where)
    raise ConfigError(
        f"{where}: cannot understand it: use host: tcp://HOST:PORT (as the original Smockron "
        "master) or a store URI such as redis://HOST:PORT/DB"
    )


def _checked(uri: str, where: str) -> str:
    try:
        parse_store_uri(uri)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return uri


def _host_port_db(spec: Mapping[str, Any], where: str) -> str:
    """smockron's ``{host, port, db}`` (the original reads only ``host``)."""
    host, port, db = spec.get("host", "127.0.0.1"), spec.get("port", 6379), spec.get("db", 0)
    if "://" in str(host):
        raise ConfigError(f"{where}: give either host: {host!r} or a bare host with port and db")
    return f"redis://{host}:{port}/{db}"


_LOCAL_HOSTS = ("", "localhost", "127.0.0.1")


def _original_datastore(store: Mapping[str, Any], where: str) -> str:
    """The original's ``datastore.host``, as its Redis client (then-redis) reads it."""
    if set(store) & {"port", "db"}:
        if "://" not in str(store.get("host", "")):  # smockron's own {host, port, db}
            return _host_port_db(store, where)
        raise ConfigError(f"{where}: put the port and database in the host URI")
    host = store.get("host")
    if host is None or host in _LOCAL_HOSTS:
        return "redis://127.0.0.1:6379/0"  # what the original connects to
    if isinstance(host, dict):  # then-redis options: {host, port, database, password}
        return _redis_uri(
            str(host.get("host") or "127.0.0.1"),
            host.get("port"),
            host.get("database"),
            host.get("password"),
            where,
        )
    if not isinstance(host, str):
        raise ConfigError(f"{where}: host must be text such as tcp://HOST:PORT")
    if "://" not in host:
        uri = f"tcp://{host}" if ":" in host else f"tcp://{host}:6379"
        raise ConfigError(
            f"{where}: the original Smockron master's Redis client does not read a host "
            f"without tcp:// (it connects to 127.0.0.1:6379, or to a host named after the "
            f"port), which is surely not what {host!r} means: write host: {uri!r}"
        )
    parts = urlsplit(host)
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"{where}: the port in {host!r} is not a number") from None
    if "://" in host.split("://", 1)[1]:
        raise ConfigError(f"{where}: {host!r} holds a URI inside a URI")
    # then-redis takes the user part of the URI as the database, the password as itself
    return _redis_uri(parts.hostname or "127.0.0.1", port, parts.username, parts.password, where)


def _redis_uri(host: str, port: Any, database: Any, password: Any, where: str) -> str:
    """A redis:// URI, with then-redis's defaults (``parseInt(x) || default``)."""
    number, db = _js_int(port) or 6379, _js_int(database) or 0
    if not 0 < number < 65536:
        raise ConfigError(f"{where}: port {number} is out of range")
    auth = f":{quote(str(password), safe='')}@" if password else ""
    name = f"[{host}]" if ":" in host else host
    return f"redis://{auth}{name}:{number}/{db}"


_JS_INT_RE = re.compile(r"\s*([+-]?\d+)", re.ASCII)


def _js_int(value: Any) -> int:
    """JavaScript's ``parseInt(value, 10)``, with NaN as 0."""
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, int | float):
        return int(value) if math.isfinite(value) else 0
    match = _JS_INT_RE.match(str(value))
    return int(match.group(1)) if match else 0


def _yaml_domain(name: str, spec: Any, file: str) -> DomainPolicy:
    """A domain of the original's YAML: its ``rate``/``interval`` and ``burst`` with the
    original's arithmetic, run with GCRA; smockron's ``rules`` and ``algorithm`` too."""
    where = f"{file}, domain {name!r}"
    return domain_policy(spec, where, _original_rule, _ORIGINAL_KEYS, ORIGINAL_ALGORITHM)


def _original_rule(spec: Mapping[str, Any], where: str) -> Rule:
    """The original's ``configureDomains``: milliseconds between requests (``I``) and of
    tolerance (``B``), then the smockron rule with that interval and ``B / I`` burst."""
    rate, interval = spec.get("rate"), spec.get("interval")
    if rate:  # the original tests truthiness: an empty rate falls to interval
        if not isinstance(rate, str):
            raise ConfigError(f"{where}: rate {rate!r} must be text such as '3/sec'")
        try:
            ms = original_rate_interval_ms(rate)
            if ms is None:  # not the original's syntax: smockron's ("1.5/s", "10 secs")
                ms = 1000.0 / parse_rate(rate)
        except RuleError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        what = f"rate {rate!r}"
    elif interval:
        ms = _interval(interval, "interval", where)
        what = f"interval {interval!r}"
    else:
        raise ConfigError(f"{where}: needs a rate (such as '3/sec') or an interval ('333ms')")
    if not (ms > 0 and math.isfinite(ms)):
        raise ConfigError(
            f"{where}: {what} is one request every {ms:g} ms once rounded to whole "
            "milliseconds as the original Smockron master rounds it, which limits nothing"
        )
    if "burst" not in spec:
        raise ConfigError(f"{where}: needs a burst (a count such as 10, or a duration '2s')")
    burst = spec["burst"]
    if isinstance(burst, int | float) and not isinstance(burst, bool):
        tolerance = ms * burst
    elif isinstance(burst, str) and re.fullmatch(r"\d+", burst, re.ASCII):
        tolerance = ms * int(burst)
    else:
        tolerance = _interval(burst, "burst", where)
    return _rule_from_ms(ms, tolerance, burst, where)


def _interval(value: Any, what: str, where: str) -> float:
    try:
        return original_interval_ms(value)
    except RuleError as exc:
        raise ConfigError(f"{where}: {what} {value!r}: {exc}") from None


def _rule_from_ms(interval: float, tolerance: float, burst: Any, where: str) -> Rule:
    """A rule whose ``interval_ms`` is ``interval`` (to the last bit where a double
    allows) and whose burst is ``tolerance / interval`` requests."""
    count = tolerance / interval
    whole = round(count)
    if abs(count - whole) > 1e-9 * max(1.0, count):
        whole = math.floor(count)
        if whole >= 1:
            log.warning(
                "%s: burst %r is %g ms, %.3f intervals of %g ms; smockron's burst counts "
                "whole requests, so %d is used (%g ms)",
                where,
                burst,
                tolerance,
                count,
                interval,
                whole,
                whole * interval,
            )
    if whole < 1:
        raise ConfigError(
            f"{where}: burst {burst!r} is {tolerance:g} ms, less than one interval of "
            f"{interval:g} ms; smockron's burst is at least one request"
        )
    return Rule(rate_for_interval(interval), whole)


def rate_for_interval(interval_ms: float) -> float:
    """The rate (per second) whose ``1000 / rate`` is ``interval_ms``: exactly when a
    double allows it (most whole numbers of ms), else the nearest (off by one ulp)."""
    best = 1000.0 / interval_ms
    error = abs(1000.0 / best - interval_ms)
    for direction in (math.inf, 0.0):
        rate = best
        for _ in range(4):
            rate = math.nextafter(rate, direction)
            if abs(1000.0 / rate - interval_ms) < error:
                best, error = rate, abs(1000.0 / rate - interval_ms)
    return best
