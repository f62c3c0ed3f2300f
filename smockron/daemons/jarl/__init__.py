"""JARL (Just A Rate Limiter), a drop-in: the pure algorithm, its TCP server, its command."""

from __future__ import annotations

from smockron.daemons.jarl.algorithm import Jarl, format_delay
from smockron.daemons.jarl.server import JarlServer, JarlStats

__all__ = ["Jarl", "JarlServer", "JarlStats", "format_delay"]
