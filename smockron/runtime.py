"""One daemon lifecycle for every ``smockron`` command.

``run(main, name=...)`` runs ``main(stop)`` on a fresh event loop (uvloop when installed)
with the signals every daemon handles the same way:

* SIGTERM: ``stop`` is set; ``main`` closes what it opened and returns; exit 0. If it has
  not returned after ``grace`` seconds (10 by default) the process exits 1 anyway, so a
  stuck peer cannot hold a rolling restart.
* SIGINT (Ctrl-C): the same graceful stop, one line on stderr, exit 130 (a second
  Ctrl-C exits at once).
* SIGHUP: ``reload()`` where the command has something to reload (a config file, TLS
  files); otherwise one line saying there is nothing to reload. SIGHUP never kills.

Logging is configured here too: ``text`` (one line a record) or ``json`` (one object a
line: ts, level, logger, msg and any extra fields), and stats lines in one format.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from smockron import compiled

log = logging.getLogger("smockron.runtime")

DEFAULT_GRACE_S = 10.0
EXIT_INTERRUPTED = 130
EXIT_DEADLINE = 1

# ---------------------------------------------------------------------------- logging

_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_format = "text"


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``ts``, ``level``, ``logger``, ``msg``, then extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in entry:
                entry[key] = value
        fields = entry.pop("fields", None)
        if isinstance(fields, Mapping):
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str | None = None, fmt: str | None = None) -> None:
    """Set the root logger: ``level`` (else $SMOCKRON_LOG_LEVEL, else INFO) and ``fmt``
    (``text``/``json``, else $SMOCKRON_LOG_FORMAT, else text). Called again by a
    subcommand whose own ``--log-level``/``--log-format`` override the group's."""
    from smockron.errors import ConfigError

    level = (level or os.environ.get("SMOCKRON_LOG_LEVEL") or "INFO").upper()
    fmt = (fmt or os.environ.get("SMOCKRON_LOG_FORMAT") or "text").lower()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ConfigError(
            f"log level {level!r} (SMOCKRON_LOG_LEVEL?): use DEBUG, INFO, WARNING, ERROR"
        )
    if fmt not in ("text", "json"):
        raise ConfigError(f"log format {fmt!r} (SMOCKRON_LOG_FORMAT?): use text or json")
    global _format
    _format = fmt
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time (a test may swap it); ours to
    replace when a subcommand's own ``--log-format`` overrides the group's."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def announce(text: str, level: int = logging.INFO) -> None:
    """A line for the operator whatever the log level (``... serving``, a fatal error):
    plain in text mode, an object in JSON mode so every line of stderr still parses."""
    if _format == "json":
        record = logging.LogRecord("smockron", level, "", 0, text, None, None)
        text = JsonFormatter().format(record)
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def logfmt(fields: Mapping[str, Any]) -> str:
    """``key=value`` pairs; values with spaces, quotes or ``=`` are quoted."""
    parts = []
    for key, value in fields.items():
        text = f"{value:g}" if isinstance(value, float) else str(value)
        if not text or any(c in text for c in ' "=\\') or not text.isprintable():
            text = json.dumps(text)
        parts.append(f"{key}={text}")
    return " ".join(parts)


def log_stats(logger: logging.Logger, fields: Mapping[str, Any], event: str = "stats") -> None:
    """The one stats line: ``stats key=value ...`` in text, the fields themselves in JSON."""
    logger.info("%s %s", event, logfmt(fields), extra={"fields": {"event": event, **fields}})


# ---------------------------------------------------------------------------- startup line


def loop_name() -> str:
    return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"


def startup_line(command: str, **facts: Any) -> None:
    """One line naming what is active: the compiled twins this process *loaded*
    (smockron.compiled's registry; ``none`` with ``SMOCKRON_PURE_PYTHON=1``), loop,
    allocator, and the command's own facts (store, discovery, TLS...), so an operator sees
    from the log what runs. Only a log line: it installs nothing."""
    fields: dict[str, Any] = {"command": command, "loop": loop_name(), "malloc": allocator()}
    fields["extensions"] = ",".join(compiled.loaded()) or "none"
    fields.update(facts)
    log_stats(logging.getLogger(f"smockron.{command}"), fields, event="starting")


# ---------------------------------------------------------------------------- the allocator

PRELOADED = {"jemalloc": "jemalloc", "mimalloc": "mimalloc", "tcmalloc": "tcmalloc"}
"""Allocators an operator may put under CPython with ``LD_PRELOAD`` (by library name)."""


def allocator() -> str:
    """The allocator CPython uses for its objects in this process, for the startup line:
    ``pymalloc`` (its own, the default) or what ``PYTHONMALLOC`` chose before it started
    (``malloc``: the C library's, which gives a wave's memory back), with ``+jemalloc``
    (or mimalloc, tcmalloc) where ``LD_PRELOAD`` put one under the C library's ``malloc``
    (docs/deployment.md)."""
    if sys.flags.dev_mode:
        return "pymalloc_debug"
    chosen = os.environ.get("PYTHONMALLOC") or "pymalloc"
    preload = os.environ.get("LD_PRELOAD", "")
    for marker, label in PRELOADED.items():
        if marker in preload:
            return f"{chosen}+{label}"
    return chosen


# ---------------------------------------------------------------------------- the loop


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's loop factory if it is installed, else asyncio's default."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


class Lifecycle:
    """The signal handling of one run: which signal stopped it, the deadline after it."""

    def __init__(
        self,
        name: str,
        reload: Callable[[], Any] | None,
        grace: float,
        extra: Mapping[signal.Signals, Callable[[], Any]],
    ) -> None:
        self.name = name
        self.reload = reload
        self.grace = grace
        self.extra = extra
        self.stop = asyncio.Event()
        self.stopped_by: signal.Signals | None = None

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._on_stop, signal.SIGTERM)
        loop.add_signal_handler(signal.SIGINT, self._on_stop, signal.SIGINT)
        loop.add_signal_handler(signal.SIGHUP, self._on_reload)
        for sig, callback in self.extra.items():
            loop.add_signal_handler(sig, callback)

    def uninstall(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, *self.extra):
            loop.remove_signal_handler(sig)

    def _on_stop(self, sig: signal.Signals) -> None:
        if self.stopped_by is not None:
            if sig == signal.SIGINT:  # a second Ctrl-C: the user means now
                _exit_now(EXIT_INTERRUPTED)
            return
        self.stopped_by = sig
        if sig == signal.SIGINT:  # the one line of Ctrl-C (through logging: JSON stays JSON)
            log.warning("%s: interrupted, stopping", self.name)
        else:
            log.info(
                "%s: received %s, shutting down (deadline %g s)", self.name, sig.name, self.grace
            )
        asyncio.get_running_loop().call_later(self.grace, self._too_slow)
        self.stop.set()

    def _too_slow(self) -> None:
        log.error(
            "%s: not stopped %g s after %s; exiting",
            self.name,
            self.grace,
            self.stopped_by.name if self.stopped_by else "the signal",
        )
        interrupted = self.stopped_by == signal.SIGINT
        _exit_now(EXIT_INTERRUPTED if interrupted else EXIT_DEADLINE)

    def _on_reload(self) -> None:
        if self.reload is None:
            log.info("%s: SIGHUP: no config file to reload (restart to apply changes)", self.name)
            return
        try:
            self.reload()
        except Exception as exc:  # a reload must never take the daemon down
            log.error("%s: reload failed, keeping the current settings: %s", self.name, exc)


def _exit_now(code: int) -> None:
    logging.shutdown()
    sys.stderr.flush()
    os._exit(code)


def run(
    main: Callable[[asyncio.Event], Awaitable[None]],
    *,
    name: str,
    reload: Callable[[], Any] | None = None,
    grace: float = DEFAULT_GRACE_S,
    extra_signals: Mapping[signal.Signals, Callable[[], Any]] | None = None,
) -> None:
    """Run ``main(stop)`` until it returns: it should serve until ``stop`` is set, then close.

    Exits 130 (``SystemExit``) when SIGINT stopped it; returns normally after SIGTERM.
    Raises :class:`smockron.compiled.MissingCompiled` (a ConfigError: exit 2) before
    anything runs where ``SMOCKRON_REQUIRE_COMPILED=1`` and a compiled twin is not built.
    """
    compiled.require()  # SMOCKRON_REQUIRE_COMPILED=1 and a twin missing: refuse to start
    lifecycle = Lifecycle(name, reload, grace, extra_signals or {})

    async def supervised() -> None:
        lifecycle.install()
        try:
            await main(lifecycle.stop)
        finally:
            lifecycle.uninstall()

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(supervised())
    if lifecycle.stopped_by == signal.SIGINT:
        raise SystemExit(EXIT_INTERRUPTED)
