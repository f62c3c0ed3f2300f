"""Prometheus collectors over a daemon's plain counters, read at scrape time.

Daemons keep their counters as ints (see smockron/counters.py) and expose them as a
``dict[str, int]``; :class:`CountersCollector` turns that dict into metric families
when Prometheus scrapes, so the hot paths pay nothing for metrics. Several sources of
one kind (two ASGI middlewares in one process) add up into one set of families.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

Source = Callable[[], Mapping[str, int]]


class HasStats(Protocol):
    def stats(self) -> Mapping[str, int]: ...


@dataclass(frozen=True, slots=True)
class Layout:
    """How a source's keys become metrics: ``prefix_<key>`` counters (``_total``), the
    ``gauges`` as gauges, and ``groups`` folded into one labelled counter each
    (``{"decisions": ("verdict", ("accepted", "delayed", "rejected"))}``)."""

    prefix: str
    gauges: frozenset[str] = frozenset()
    groups: Mapping[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    docs: Mapping[str, str] = field(default_factory=dict)

    def families(self, values: Mapping[str, int]) -> Iterator[Metric]:
        grouped: set[str] = set()
        for name, (label, keys) in self.groups.items():
            family = CounterMetricFamily(f"{self.prefix}_{name}", self._doc(name), labels=[label])
            for key in keys:
                family.add_metric([key], values.get(key, 0))
                grouped.add(key)
            yield family
        for key, value in values.items():
            if key in grouped:
                continue
            metric = f"{self.prefix}_{key}"
            if key in self.gauges:
                yield GaugeMetricFamily(metric, self._doc(key), value=value)
            else:
                yield CounterMetricFamily(metric, self._doc(key), value=value)

    def _doc(self, key: str) -> str:
        return self.docs.get(key) or key.replace("_", " ").capitalize()


class CountersCollector(Collector):
    """One source's counters, laid out by ``layout``."""

    def __init__(self, layout: Layout, source: Source) -> None:
        self.layout = layout
        self.source = source

    def collect(self) -> Iterator[Metric]:
        return self.layout.families(self.source())


class SummedCollector(Collector):
    """The sum of every live object registered with it (held weakly: a middleware that
    is garbage-collected stops counting, and is never kept alive by metrics)."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._objects: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()

    def add(self, obj: HasStats) -> None:
        with self._lock:
            self._objects.add(obj)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            objects = list(self._objects)
        total: dict[str, int] = {}
        for obj in objects:
            for key, value in obj.stats().items():
                total[key] = total.get(key, 0) + value
        return self.layout.families(total)


_summed: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, SummedCollector]] = (
    weakref.WeakKeyDictionary()
)
_summed_lock = threading.Lock()


def register_summed(registry: CollectorRegistry, layout: Layout, obj: HasStats) -> None:
    """Count ``obj`` in ``registry`` under ``layout``, added to any others already there."""
    with _summed_lock:
        per_registry = _summed.setdefault(registry, {})
        collector = per_registry.get(layout.prefix)
        if collector is None:
            collector = per_registry[layout.prefix] = SummedCollector(layout)
            registry.register(collector)
    collector.add(obj)
