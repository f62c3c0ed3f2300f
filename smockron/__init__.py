"""Smockron: a distributed rate limiter.

The pure core lives in :mod:`smockron.core` (algorithms) and :mod:`smockron.wire`
(the Smockron wire codec); every front end (master, gatekeepers, cluster, daemons)
is a thin adapter around them.
"""

from __future__ import annotations

from smockron.errors import ConfigError, ProtocolError, RuleError, SmockronError

__version__ = "0.1.0"

__all__ = ["ConfigError", "ProtocolError", "RuleError", "SmockronError", "__version__"]
