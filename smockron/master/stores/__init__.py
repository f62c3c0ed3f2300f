"""Stores chosen by URI: ``memory://`` (default) or ``redis://HOST:PORT/DB``, the latter
optionally with ``?layout=original`` (the original Smockron master's keys and values)."""

from __future__ import annotations

from smockron import errors
from smockron.master.stores.base import Scope, State, Store, Table
from smockron.master.stores.memory import MemoryStore
from smockron.master.stores.uri import StoreURI, parse_store_uri

__all__ = ["MemoryStore", "Scope", "State", "Store", "StoreURI", "Table", "open_store",
           "parse_store_uri"]  # fmt: skip

def open_store(uri: str) -> Store:
    """The store a URI names; Redis is imported only when asked for."""
    parsed = parse_store_uri(uri)
    if parsed.scheme == "memory":
        return MemoryStore()
    try:
        from smockron.master.stores.original import OriginalLayoutStore
        from smockron.master.stores.redis import RedisStore
    except ImportError as exc:
        raise errors.ConfigError(f"the redis store needs smockron[redis]: {exc}") from None
    if parsed.layout == "original":
        return OriginalLayoutStore(parsed.client_uri)
    return RedisStore(parsed.client_uri)
