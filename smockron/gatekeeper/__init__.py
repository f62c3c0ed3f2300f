"""Smockron gatekeepers: decide locally, report every decision, fail open.

:class:`Gatekeeper` (threads) and :class:`AsyncGatekeeper` (asyncio) speak the Smockron
protocol to a master; :class:`SmockronMiddleware` (ASGI) and
:class:`SmockronWSGIMiddleware` (WSGI) put one in front of a web app, and
``smockron proxy`` (``smockron.gatekeeper.proxy``) in front of any service.
"""

from __future__ import annotations

from smockron.gatekeeper._asyncio import AsyncGatekeeper
from smockron.gatekeeper._base import GatekeeperOptions
from smockron.gatekeeper._decider import Verdict
from smockron.gatekeeper._threaded import Gatekeeper
from smockron.gatekeeper.asgi import SmockronMiddleware
from smockron.gatekeeper.httpgate import HttpGate, http_loginfo
from smockron.gatekeeper.identify import ForwardedFor, RequestInfo, header, peer_address
from smockron.gatekeeper.wsgi import SmockronWSGIMiddleware

__all__ = [
    "AsyncGatekeeper",
    "ForwardedFor",
    "Gatekeeper",
    "GatekeeperOptions",
    "HttpGate",
    "RequestInfo",
    "SmockronMiddleware",
    "SmockronWSGIMiddleware",
    "Verdict",
    "header",
    "http_loginfo",
    "peer_address",
]
