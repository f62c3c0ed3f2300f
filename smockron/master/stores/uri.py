"""Store URIs, checked before anything connects: ``memory://``, ``redis://HOST:PORT/DB``,
``rediss://...``, ``unix:///path?db=N``.

A Redis URI may add ``layout=original`` (``redis://HOST:PORT/DB?layout=original``):
states are then kept under the original Smockron master's keys and values, so that it
and smockron can share one Redis (``smockron.master.stores.original``). The option is
taken out of the URI given to the Redis client, which knows nothing of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from smockron.errors import ConfigError

LAYOUTS = ("smockron", "original")
REDIS_SCHEMES = ("redis", "rediss", "unix")


@dataclass(frozen=True, slots=True)
class StoreURI:
    """A checked store URI: its scheme, the URI for the client, and the key layout."""

    scheme: str
    client_uri: str
    layout: str = "smockron"


def parse_store_uri(uri: str) -> StoreURI:
    """Check ``uri`` and split off smockron's own options; errors name the URI."""
    scheme, sep, _rest = uri.partition("://")
    if not sep:
        raise ConfigError(f"store {uri!r} is not a URI: use memory:// or redis://HOST:PORT/DB")
    if scheme == "memory":
        if _rest:
            raise ConfigError(f"store {uri!r}: memory:// takes no host, path or options")
        return StoreURI("memory", uri)
    if scheme not in REDIS_SCHEMES:
        raise ConfigError(f"unknown store scheme {scheme!r} in {uri!r}: use memory or redis")
    if "://" in _rest:
        raise ConfigError(f"store {uri!r} holds a URI inside a URI: write {scheme}://HOST:PORT/DB")
    parts = urlsplit(uri)
    query = parse_qsl(parts.query, keep_blank_values=True)
    layouts = [value for name, value in query if name == "layout"]
    layout = layouts[-1] if layouts else "smockron"
    if layout not in LAYOUTS:
        raise ConfigError(f"store {uri!r}: unknown layout {layout!r}: use {' or '.join(LAYOUTS)}")
    if scheme == "unix":
        if not parts.path:
            raise ConfigError(f"store {uri!r} names no socket: use unix:///PATH/redis.sock")
    else:
        _check_host_port_db(uri, parts.netloc, parts.path)
    rest = urlencode([(name, value) for name, value in query if name != "layout"])
    return StoreURI(scheme, urlunsplit(parts._replace(query=rest)), layout)


def _check_host_port_db(uri: str, netloc: str, path: str) -> None:
    """``HOST[:PORT]`` and ``/DB``; ``redis://tcp://h:p`` (a URI inside a URI) fails here."""
    hostport = netloc.rpartition("@")[2]
    host, port = hostport, ""
    if not hostport.endswith("]"):  # an IPv6 literal is [addr] or [addr]:port
        host, _, port = hostport.rpartition(":") if ":" in hostport else (hostport, "", "")
    if not host.strip("[]"):
        raise ConfigError(f"store {uri!r} names no host: use redis://HOST:PORT/DB")
    if ":" in hostport and not hostport.endswith("]") and not (port.isdigit() and port.isascii()):
        raise ConfigError(f"store {uri!r}: port {port!r} is not a number")
    if port and not 0 < int(port) < 65536:
        raise ConfigError(f"store {uri!r}: port {port} is out of range")
    db = path.lstrip("/") if path.count("/") <= 1 else path
    if db and not (db.isdigit() and db.isascii()):
        raise ConfigError(f"store {uri!r}: database {db!r} is not a number")
