"""Observability shared by every daemon: one HTTP listener (``/metrics``, ``/healthz``,
``/readyz``), readiness checks, collectors over plain counters, the gatekeeper's
heard-from-the-master watch, and ``smockron top`` (in :mod:`smockron.observe.top`,
imported on demand as it needs ``rich``)."""

from __future__ import annotations

from smockron.observe.collect import CountersCollector, Layout, register_summed
from smockron.observe.heard import MasterWatch
from smockron.observe.http import ObserveServer, loop_alive, parse_listen, serve
from smockron.observe.readiness import Check, Readiness, bound

__all__ = [
    "Check",
    "CountersCollector",
    "Layout",
    "MasterWatch",
    "ObserveServer",
    "Readiness",
    "bound",
    "loop_alive",
    "parse_listen",
    "register_summed",
    "serve",
]
