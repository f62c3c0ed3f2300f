"""Reload the descriptor files when they change, as envoyproxy/ratelimit reloads its runtime.

``ConfigReloader.check()`` compares the files' names, sizes and modification times with
the last load; on a change it loads them all again and swaps the servicer's config in
one assignment. A file that does not load leaves the running config in place (logged and
counted in ``stats.config_errors``), so a half-written edit never drops every limit.

``paths`` may also be a function that lists the files (envoyproxy/ratelimit's runtime
directory, whose files are found anew at each check); ``on_load`` is told of each config
installed (the health check's "at least one config loaded").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from smockron.cluster.envoy.config import EnvoyConfig, expand_paths, load_config
from smockron.cluster.envoy.service import RateLimitServicer
from smockron.errors import ConfigError

log = logging.getLogger(__name__)

Signature = tuple[tuple[str, int, int, int], ...]
"""``(path, mtime_ns, size, inode)`` per file: the inode tells a swapped symlinked tree
(envoyproxy/ratelimit's runtime directories) from the old one even when the new files
have the same times and sizes."""


class ConfigReloader:
    def __init__(
        self,
        servicer: RateLimitServicer,
        paths: str | Path | Iterable[str | Path] | Callable[[], list[Path]],
        interval: float = 5.0,
        on_load: Callable[[EnvoyConfig], None] | None = None,
    ) -> None:
        self.servicer = servicer
        self._lister: Callable[[], list[Path]]
        if callable(paths):
            self._lister = paths
        else:
            fixed = [paths] if isinstance(paths, str | Path) else list(paths)
            self._lister = lambda: expand_paths(fixed)
        self.interval = interval
        self.on_load = on_load
        self._signature = self._current()

    def check(self) -> bool:
        """Reload if the files changed; True when a new config was installed."""
        signature = self._current()
        if signature == self._signature:
            return False
        self._signature = signature
        try:
            config = load_config([Path(entry[0]) for entry in signature])
        except ConfigError as exc:
            self.servicer.stats.config_errors += 1
            log.error("envoy: keeping the running config, the new one does not load: %s", exc)
            return False
        self.servicer.config = config
        self.servicer.stats.config_loads += 1
        if self.on_load is not None:
            self.on_load(config)
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
        for path in self._lister():
            try:
                st = path.stat()
            except OSError:
                entries.append((str(path), -1, -1, -1))
                continue
            entries.append((str(path), st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(entries)
