"""One settings layer for every ``smockron`` command.

Each setting is taken from the first of these that has it:

1. the command-line flag (``--stats-interval 30s``);
2. the environment variable ``SMOCKRON_<COMMAND>_<OPTION>`` (``SMOCKRON_MASTER_STATS_INTERVAL``);
   the cluster also reads Gubernator's ``GUBER_*`` names and envoyproxy/ratelimit's names,
   below the ``SMOCKRON_CLUSTER_*`` ones;
3. the TOML file given by ``--config`` (keys are option names, dashes or underscores);
   the master and dthrottle keep their own file formats, read by their own loaders;
4. the default.

Click does the layering (flags, then ``envvar``, then ``default_map``, then the default);
this module names the variables, loads the file into the ``default_map``, gives the one
duration and the one ``host:port`` parser, and makes every bad value an error that names
where it came from (flag, variable or ``file:key``) so ``smockron`` can print one line and
exit 2.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from smockron.errors import ConfigError

# ---------------------------------------------------------------------------- durations

_UNIT_MS = {
    "ns": 1e-6,
    "us": 1e-3,
    "µs": 1e-3,
    "μs": 1e-3,
    "ms": 1.0,
    "s": 1000.0,
    "m": 60_000.0,
    "h": 3_600_000.0,
    "d": 86_400_000.0,
}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ns|us|µs|μs|ms|s|m|h|d)")
_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")


def parse_duration_ms(text: str, *, bare: str | None = "s") -> float:
    """A duration in milliseconds: ``500ms``, ``2s``, ``1.5m``, ``1h``, ``1d`` or Go's
    ``1m30s``.

    A bare number is in the unit ``bare`` names; with ``bare=None`` it is refused (except
    ``0``), for flags whose bare numbers once meant milliseconds: refusing beats silently
    changing what a user's script means.
    """
    value = text.strip()
    if _NUMBER.fullmatch(value):
        if bare is None and float(value) != 0:
            raise ConfigError(f"duration {text!r} has no unit: write e.g. {value}ms or {value}s")
        return float(value) * _UNIT_MS[bare or "s"]
    total = _sum_parts(value, _PART)
    if total is None:
        raise ConfigError(f"cannot parse duration {text!r}: use e.g. 500ms, 2s, 1m30s, 1h")
    return total


_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration_ms(text: str) -> float:
    """Go's ``time.ParseDuration`` syntax (``500us``, ``1m30s``; no spaces, no days), in
    ms, for the ``GUBER_*`` variables; a bare number is ms, as smockron always read them."""
    value = text.strip()
    if _NUMBER.fullmatch(value):
        return float(value)
    total = _sum_parts(value, _GO_PART)
    if total is None:
        raise ConfigError(f"invalid duration {text!r}: use e.g. 500us, 100ms, 1s")
    return total


def _sum_parts(value: str, part: re.Pattern[str]) -> float | None:
    """``1m30s`` as ms: every character in a NUMBER+UNIT part, or None."""
    pos, total = 0, 0.0
    for match in part.finditer(value):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_MS[match.group(2)]
        pos = match.end()
    return total if pos != 0 and pos == len(value) else None


def parse_duration(text: str, *, bare: str | None = "s") -> float:
    """:func:`parse_duration_ms` in seconds."""
    return parse_duration_ms(text, bare=bare) / 1000.0


# ---------------------------------------------------------------------------- addresses


def parse_master(spec: str) -> tuple[str, str]:
    """A master's ``ACC_ADDR,CTL_ADDR`` (``--master``, ``--peer``, ``--advertise``): its
    accounting and control addresses, e.g. ``tcp://10.0.0.5:10004,tcp://10.0.0.5:10005``."""
    acc, sep, ctl = spec.partition(",")
    if not sep or not acc.strip() or not ctl.strip():
        raise ConfigError(f"cannot parse master {spec!r}: expected ACC_ADDR,CTL_ADDR")
    return acc.strip(), ctl.strip()


WILDCARD_HOSTS = frozenset({"", "*", "0.0.0.0", "::", "[::]"})
"""Hosts that mean every interface, as an address may write them (IPv6 in brackets or
not): a node listening there is reached at another address."""


def parse_host_port(text: str, *, listen: bool = False) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPV6]:PORT`` or (to listen) ``*:PORT`` / ``:PORT``.

    The port is 1-65535; a listening address may also take 0 (any free port).
    """
    value = text.strip()
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(f"address {text!r}: put an IPv6 address in brackets, e.g. [::1]:8080")
    if not sep or not port.isdigit() or not port.isascii():
        raise ConfigError(f"address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    low = 0 if listen else 1
    if not low <= int(port) <= 65535:
        raise ConfigError(f"address {text!r}: port {port} is not in {low}..65535")
    if not host and not listen:
        raise ConfigError(f"address {text!r} names no host")
    return host, int(port)


def parse_listen(text: str) -> tuple[str, int]:
    """:func:`parse_host_port` of an address to listen on, ``*`` or an empty host (every
    interface) as ``0.0.0.0``."""
    host, port = parse_host_port(text, listen=True)
    return ("0.0.0.0" if host in ("", "*") else host), port


def check_zmq_address(text: str) -> str:
    """A ZeroMQ endpoint, kept as written: ``tcp://HOST:PORT`` (``*`` for every interface,
    port ``*`` for any free one), ``ipc://PATH`` or ``inproc://NAME``."""
    scheme, sep, rest = text.partition("://")
    if sep and scheme in ("ipc", "inproc") and rest:
        return text
    if not sep or scheme != "tcp":
        raise ConfigError(
            f"ZeroMQ address {text!r}: expected tcp://HOST:PORT (or ipc://, inproc://)"
        )
    if rest.endswith(":*"):
        rest = rest[:-1] + "0"
    try:
        parse_host_port(rest, listen=True)
    except ConfigError as exc:
        raise ConfigError(f"ZeroMQ address {text!r}: {exc}") from None
    return text


# ---------------------------------------------------------------------------- click types

if TYPE_CHECKING:  # generic from click 8.2 on; the package accepts 8.1
    from click.decorators import FC

    _ParamType = click.ParamType[Any, Any]
else:
    _ParamType = click.ParamType


class Duration(_ParamType):
    """A duration flag, converted to seconds (or ms with ``unit="ms"``)."""

    name = "duration"

    def __init__(self, *, bare: str | None = "s", unit: str = "s") -> None:
        self.bare = bare
        self.divisor = 1.0 if unit == "ms" else 1000.0

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)  # a TOML number: the same rule as a bare flag value
        try:
            return parse_duration_ms(str(value), bare=self.bare) / self.divisor
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


class HostPort(_ParamType):
    """A ``HOST:PORT`` flag, checked and kept as text (IPv6 in brackets)."""

    name = "host:port"

    def __init__(
        self, *, listen: bool = False, optional: bool = False, any_port: bool = True
    ) -> None:
        self.listen = listen
        self.optional = optional  # "" turns the listener off
        self.any_port = any_port  # port 0 (any free one) allowed

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if self.optional and str(value) == "":
            return ""
        try:
            _host, port = parse_host_port(str(value), listen=self.listen)
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)
        if port == 0 and not self.any_port:
            self.fail(
                f"{value!r}: port 0 (any free port) cannot be found by a scraper or a "
                "probe: name the port",
                param,
                ctx,
            )
        return str(value)


def metrics_option(
    help: str = "Serve /metrics, /healthz, /readyz here.",
) -> Callable[[FC], FC]:
    """Every command's ``--metrics HOST:PORT`` flag, spelled once."""
    return click.option(
        "--metrics", type=HostPort(listen=True, any_port=False), metavar="HOST:PORT", help=help
    )


class ZmqAddress(_ParamType):
    """A ZeroMQ endpoint flag (``tcp://HOST:PORT``), checked and kept as text."""

    name = "endpoint"

    def get_metavar(self, *args: Any, **kwargs: Any) -> str:
        return "tcp://HOST:PORT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return check_zmq_address(str(value))
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


# ---------------------------------------------------------------------------- sources


def env_name(command: str, option: str) -> str:
    """``SMOCKRON_<COMMAND>_<OPTION>``: ``--batch-timeout`` of cluster is
    ``SMOCKRON_CLUSTER_BATCH_TIMEOUT``."""
    return f"SMOCKRON_{command}_{option.lstrip('-')}".upper().replace("-", "_")


def _long_name(param: click.Parameter) -> str | None:
    names = [o for o in param.opts if o.startswith("--")]
    return names[0] if names else None


def source_of(ctx: click.Context, param: click.Parameter) -> str:
    """Where ``param``'s value came from, as a user would look for it."""
    source = ctx.get_parameter_source(param.name or "")
    if source is ParameterSource.ENVIRONMENT:
        envvars = param.envvar if isinstance(param.envvar, list | tuple) else [param.envvar]
        found = [v for v in envvars if v and v in os.environ]
        return f"environment variable {found[0] if found else envvars[0]}"
    if source is ParameterSource.DEFAULT_MAP:
        file = ctx.meta.get(_FILE, "the config file")
        key = ctx.meta.get(_KEYS, {}).get(param.name, param.name)
        return f"{file}:{key}"
    if source is ParameterSource.DEFAULT:
        return "default"
    return f"'{_long_name(param) or param.name}'"  # quoted, as click quotes a flag


_FILE = "smockron.settings.file"
_KEYS = "smockron.settings.keys"
_PRINT = "smockron.settings.print"
_ARGS = "smockron.settings.args"


def load_toml_defaults(
    path: Path, params: Sequence[click.Parameter]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The TOML file as a click ``default_map``, and which key gave each value.

    Keys are option names with dashes or underscores (``max-delay``, ``max_delay``);
    an unknown key is an error naming it.
    """
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    by_key: dict[str, str] = {}
    for param in params:
        long = _long_name(param)
        if param.name and long and param.name not in _NOT_IN_FILE:
            by_key[long[2:].replace("-", "_")] = param.name
    options = sorted(by_key)
    for param in params:
        if param.name and param.name not in _NOT_IN_FILE:
            by_key.setdefault(param.name, param.name)
    values: dict[str, Any] = {}
    keys: dict[str, str] = {}
    for key, value in data.items():
        name = by_key.get(key.replace("-", "_"))
        if name is None:
            known = ", ".join(options)
            raise ConfigError(f"{path}:{key}: unknown setting (known: {known})")
        values[name] = value
        keys[name] = key
    return values, keys


# ---------------------------------------------------------------------------- the command

_OWN = ("config", "print_settings", "log_level", "log_format")
_NOT_IN_FILE = ("config", "print_settings")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")


def _config_arg(args: Sequence[str]) -> str | None:
    """The value of ``--config`` among ``args``, before click parses them."""
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--config" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


class BadValue(click.ClickException):
    """A bad setting found after click's own checks (a ConfigError): exit 2, like a bad flag."""

    exit_code = 2


class SmockronCommand(click.Command):
    """A ``smockron`` subcommand that takes its settings the one way.

    ``file_format="toml"`` adds ``--config FILE`` read as a ``default_map``;
    ``file_format=None`` means the command reads its own file (master, dthrottle).
    Every option gets ``envvar`` ``SMOCKRON_<COMMAND>_<OPTION>`` (with ``legacy_env``,
    also ``SMOCKRON_<COMMAND>_<PARAMETER>`` where the names differ), and
    ``--print-settings``, ``--log-level`` and ``--log-format`` are added.
    """

    def __init__(
        self,
        *args: Any,
        file_format: str | None = "toml",
        legacy_env: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.file_format = file_format
        if file_format == "toml":
            self.params.insert(
                0,
                click.Option(
                    ["--config"],
                    type=click.Path(dir_okay=False, path_type=Path),
                    help="TOML file of settings (keys: option names); flags and environment win.",
                ),
            )
        self.params.extend(_common_options())
        command = (self.name or "").upper()
        for param in self.params:
            long = _long_name(param)
            if isinstance(param, click.Option) and long and param.name not in _OWN[1:]:
                names = [env_name(command, long)]
                legacy = env_name(command, param.name or "")
                param.envvar = names + ([legacy] if legacy_env and legacy not in names else [])
                param.show_envvar = True

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        meta: dict[str, Any] = {_ARGS: list(args)}  # click consumes ``args``
        if self.file_format == "toml":
            path = _config_arg(args) or os.environ.get(env_name(self.name or "", "config"))
            if path:
                extra["default_map"], meta[_KEYS] = self.load_file(Path(path))
                meta[_FILE] = path
        try:
            ctx = super().make_context(info_name, args, parent, **extra)
        except click.BadParameter as exc:
            if exc.ctx is not None and exc.param is not None:
                exc.ctx.meta.update(meta)
                exc.param_hint = source_of(exc.ctx, exc.param)
            raise
        ctx.meta.update(meta)
        return ctx

    def load_file(self, path: Path) -> tuple[dict[str, Any], dict[str, str]]:
        """The ``--config`` file as a ``default_map`` and the key of each value; a
        command whose file may take another format (the cluster's) reads it here."""
        return load_toml_defaults(path, self.params)

    def invoke(self, ctx: click.Context) -> Any:
        from smockron import runtime

        level = _log_option(ctx, "log_level")
        fmt = _log_option(ctx, "log_format")
        ctx.meta[_PRINT] = ctx.params.pop("print_settings", False)
        if self.file_format == "toml":
            ctx.params.pop("config", None)  # read into the default_map already
        try:
            runtime.configure_logging(level, fmt)
            return super().invoke(ctx)
        except ConfigError as exc:
            raise BadValue(str(exc)) from None


def _log_option(ctx: click.Context, name: str) -> str | None:
    """``--log-level``/``--log-format``: after the subcommand, then before it or
    ``SMOCKRON_LOG_*``, then the command's config file."""
    own = ctx.params.pop(name, None)
    if own is not None and ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:
        return str(own)
    parent = ctx.parent.params.get(name) if ctx.parent is not None else None
    return parent or os.environ.get(f"SMOCKRON_{name.upper()}") or own


def _common_options() -> list[click.Option]:
    return [
        click.Option(
            ["--print-settings"],
            is_flag=True,
            help="Print the resolved settings as one JSON line and exit.",
        ),
        click.Option(
            ["--log-level"],
            type=click.Choice(LOG_LEVELS, case_sensitive=False),
            help="Logging threshold [SMOCKRON_LOG_LEVEL; INFO].",
        ),
        click.Option(
            ["--log-format"],
            type=click.Choice(LOG_FORMATS),
            help="text, or json: one object per line [SMOCKRON_LOG_FORMAT; text].",
        ),
    ]


def print_settings_if_asked(values: Mapping[str, Any]) -> None:
    """``--print-settings``: the effective settings as one JSON line, then exit 0."""
    ctx = click.get_current_context(silent=True)
    if ctx is None or not ctx.meta.get(_PRINT):
        return
    sys.stdout.write(json.dumps(dict(values), default=_jsonable, sort_keys=True) + "\n")
    sys.stdout.flush()
    ctx.exit(0)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list | set | frozenset):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if hasattr(value, "__dataclass_fields__"):
        return {k: getattr(value, k) for k in value.__dataclass_fields__}
    return str(value)


def reread(ctx: click.Context) -> dict[str, Any]:
    """The command's settings resolved again, the same way (flags > environment > the
    config file, read anew > defaults): what SIGHUP applies. A bad value raises
    ConfigError naming it; nothing is changed then."""
    command = ctx.command
    try:
        fresh = command.make_context(ctx.info_name, list(ctx.meta.get(_ARGS, [])), ctx.parent)
    except click.ClickException as exc:
        raise ConfigError(exc.format_message()) from None
    params = dict(fresh.params)
    for name in ("config", "print_settings", "log_level", "log_format"):
        params.pop(name, None)
    return params
