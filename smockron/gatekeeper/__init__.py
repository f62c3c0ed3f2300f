"""Smockron gatekeepers: decide locally, report every decision, fail open.

:class:`Gatekeeper` (threads) and :class:`AsyncGatekeeper` (asyncio) speak the Smockron
protocol to a master; the HTTP adapters (``asgi``, ``wsgi``, ``proxy``) sit around them.
"""

from __future__ import annotations

from smockron.gatekeeper.core import AsyncGatekeeper, Gatekeeper, now_ms
from smockron.gatekeeper.state import Decider, Decision, DelayTable, Verdict

__all__ = [
    "AsyncGatekeeper",
    "Decider",
    "Decision",
    "DelayTable",
    "Gatekeeper",
    "Verdict",
    "now_ms",
]
