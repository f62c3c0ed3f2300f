"""aiohttp's server logger minus the flood, for every aiohttp server smockron runs.

aiohttp logs every unparsable request at ERROR with a traceback (a bad method on a
connection's first request at DEBUG), so a client sending garbage could fill the disk.
``ServerLog``, given to ``web.AppRunner(..., logger=...)``, turns those into a counter and a
rate-limited warning; any other exception (a bug of ours) keeps its traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

from smockron.ratelog import RateLimitedLog


class ServerLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """The ``aiohttp.server`` logger of one server: malformed requests are counted in
    ``bad_requests`` (and passed to ``count``) and logged on ``log``, one line a while."""

    def __init__(self, log: logging.Logger, count: Callable[[], None] | None = None) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.bad_requests = 0
        self._count = count
        self._bad_log = RateLimitedLog(log)

    def _bad_request(self, kwargs: dict[str, Any]) -> bool:
        exc = kwargs.get("exc_info")
        if not isinstance(exc, HttpProcessingError):
            return False
        self.bad_requests += 1
        if self._count is not None:
            self._count()
        self._bad_log.warning("malformed HTTP request: %s", str(exc).splitlines()[0])
        return True

    def exception(self, msg: object, *args: object, **kwargs: Any) -> None:
        if not self._bad_request(kwargs):
            super().exception(msg, *args, **kwargs)

    def debug(self, msg: object, *args: object, **kwargs: Any) -> None:
        # aiohttp logs a bad method on a connection's first request (non-HTTP traffic) here
        if not self._bad_request(kwargs):
            super().debug(msg, *args, **kwargs)
