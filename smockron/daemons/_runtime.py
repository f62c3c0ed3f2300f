"""Running a daemon: uvloop when available, and a clean stop on SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's loop factory if it is installed, else asyncio's default."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def stop_event_on_signals(
    extra: dict[signal.Signals, Callable[[], Any]] | None = None,
) -> asyncio.Event:
    """An event set by SIGTERM or SIGINT; ``extra`` maps more signals to callbacks."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _stop_by(stop, sig))
    for sig, callback in (extra or {}).items():
        loop.add_signal_handler(sig, callback)
    return stop


def _stop_by(stop: asyncio.Event, sig: signal.Signals) -> Callable[[], None]:
    def handler() -> None:
        log.info("received %s, shutting down", sig.name)
        stop.set()

    return handler


def run(main: Callable[[], Awaitable[None]]) -> None:
    """Run ``main`` on a fresh (uv)loop until it returns."""

    async def wrapper() -> None:
        await main()

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(wrapper())
