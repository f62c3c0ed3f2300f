"""Stores chosen by URI: ``memory://`` (default) or ``redis://HOST:PORT/DB``, the latter
optionally with ``?layout=original`` (the original Smockron master's keys and values)."""

from __future__ import annotations

from smockron import errors
from smockron.master.stores.base import Scope, State, Store, Table
from smockron.master.stores.memory import MemoryStore
from smockron.master.stores.uri import STORES as _STORES
from smockron.master.stores.uri import StoreURI, parse_store_uri

__all__ = [
    "MemoryStore",
    "Scope",
    "State",
    "Store",
    "StoreURI",
    "Table",
    "open_store",
    "parse_store_uri",
]


def open_store(uri: str, *, snapshot: str | None = None, snapshot_interval: float = 30.0) -> Store:
    """The store a URI names; Redis is imported only when asked for. ``snapshot`` (a
    path) makes the memory store persist its states there (Redis persists them itself)."""
    parsed = parse_store_uri(uri)
    try:
        cls = _STORES.lookup(parsed.scheme)
    except ImportError as exc:
        raise errors.ConfigError(f"the redis store needs smockron[redis]: {exc}") from None
    return cls.open(parsed, snapshot, snapshot_interval)
