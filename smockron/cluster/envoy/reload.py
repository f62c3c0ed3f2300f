"""Reload the descriptor files when they change, as envoyproxy/ratelimit reloads its runtime.

``ConfigReloader.check()`` compares the files' names, sizes and modification times with
the last load; on a change it loads them all again and swaps the servicer's config in
one assignment. A file that does not load leaves the running config in place (logged and
counted in ``stats.config_errors``), so a half-written edit never drops every limit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from pathlib import Path

from smockron.cluster.envoy.config import expand_paths, load_config
from smockron.cluster.envoy.service import RateLimitServicer
from smockron.errors import ConfigError

log = logging.getLogger(__name__)

Signature = tuple[tuple[str, int, int], ...]


class ConfigReloader:
    def __init__(
        self,
        servicer: RateLimitServicer,
        paths: str | Path | Iterable[str | Path],
        interval: float = 5.0,
    ) -> None:
        self.servicer = servicer
        self.paths: list[str | Path] = [paths] if isinstance(paths, str | Path) else list(paths)
        self.interval = interval
        self._signature = self._current()

    def check(self) -> bool:
        """Reload if the files changed; True when a new config was installed."""
        signature = self._current()
        if signature == self._signature:
            return False
        self._signature = signature
        try:
            config = load_config(self.paths)
        except ConfigError as exc:
            self.servicer.stats.config_errors += 1
            log.error("envoy: keeping the running config, the new one does not load: %s", exc)
            return False
        self.servicer.config = config
        self.servicer.stats.config_loads += 1
        log.info(
            "envoy: reloaded %d domain(s) from %d file(s)", len(config.domains), len(signature)
        )
        return True

    async def run(self) -> None:
        """Poll every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            self.check()

    def _current(self) -> Signature:
        entries = []
        for path in expand_paths(self.paths):
            try:
                st = path.stat()
            except OSError:
                entries.append((str(path), -1, -1))
                continue
            entries.append((str(path), st.st_mtime_ns, st.st_size))
        return tuple(entries)
