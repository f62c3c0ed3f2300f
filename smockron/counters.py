"""The one way smockron's components keep plain integer counters and read them out.

Counters are bumped on hot paths, so each component declares them as fields of a
``@dataclass(slots=True)`` (no dict, no lock; readers in other threads are safe under
the GIL for ints) and inherits :class:`CounterSet` for the read-out used by log lines,
``stats()`` and Prometheus collectors. A field is an ``int``, or a ``Counter[str]`` of
counts by reason where the reasons are a closed set (``ProtocolError.reason``), which
the read-out gives as its total. Gauges and derived values (``accepted`` as answered
minus delayed) are added by the component's ``counters()``/``stats()`` on top of
:meth:`CounterSet.as_dict`, never stored.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class CounterSet:
    """Mixin for a counters dataclass whose fields are ints or by-reason Counters."""

    __slots__ = ()

    def as_dict(self) -> dict[str, int]:
        """Every counter by name, in declaration order (a snapshot, not a view); a
        by-reason field as its total."""
        out: dict[str, int] = {}
        for f in dataclasses.fields(cast("DataclassInstance", self)):
            value = getattr(self, f.name)
            out[f.name] = value.total() if isinstance(value, Counter) else value
        return out
