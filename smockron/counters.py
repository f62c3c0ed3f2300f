"""The one way smockron's components keep plain integer counters and read them out.

Counters are bumped on hot paths, so each component declares them as fields of a
``@dataclass(slots=True)`` (no dict, no lock; readers in other threads are safe under
the GIL for ints) and inherits :class:`CounterSet` for the read-out used by log lines,
``stats()`` and Prometheus collectors.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class CounterSet:
    """Mixin for a counters dataclass whose fields are all ints."""

    __slots__ = ()

    def as_dict(self) -> dict[str, int]:
        """Every counter by name, in declaration order (a snapshot, not a view)."""
        fields = dataclasses.fields(cast("DataclassInstance", self))
        return {f.name: getattr(self, f.name) for f in fields}
