"""Stores chosen by URI: ``memory://`` (default) or ``redis://HOST:PORT/DB``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from smockron.errors import ConfigError
from smockron.master.stores.base import Scope, State, Store, Table
from smockron.master.stores.memory import MemoryStore

if TYPE_CHECKING:
    from smockron.master.stores.redis import RedisStore

__all__ = ["MemoryStore", "Scope", "State", "Store", "Table", "open_store"]

DEFAULT_STORE = "memory://"


def open_store(uri: str) -> MemoryStore | RedisStore:
    """The store a URI names; Redis is imported only when asked for."""
    scheme, sep, _rest = uri.partition("://")
    if not sep:
        raise ConfigError(f"store {uri!r} is not a URI: use memory:// or redis://HOST:PORT/DB")
    if scheme == "memory":
        return MemoryStore()
    if scheme in ("redis", "rediss", "unix"):
        try:
            from smockron.master.stores.redis import RedisStore
        except ImportError as exc:
            raise ConfigError(f"the redis store needs smockron[redis]: {exc}") from None
        return RedisStore(uri)
    raise ConfigError(f"unknown store scheme {scheme!r} in {uri!r}: use memory or redis")
