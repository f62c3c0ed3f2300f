"""Store URIs, checked before anything connects: ``memory://``, ``redis://HOST:PORT/DB``,
``rediss://...``, ``unix:///path?db=N``, and as the ``limits`` library names them
``redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]`` (the master a
Redis Sentinel names) and ``redis+cluster://[:PASSWORD@]HOST:PORT[,HOST:PORT...]``
(a Redis Cluster, any of its nodes to start from).

A Redis URI may add ``layout=original`` (``redis://HOST:PORT/DB?layout=original``):
states are then kept under the original Smockron master's keys and values, so that it
and smockron can share one Redis (``smockron.master.stores.original``). The option is
taken out of the URI given to the Redis client, which knows nothing of it.

:data:`STORES` maps each scheme to the store class that serves it (see
``smockron.registry``); ``open_store`` looks the class up there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from smockron.errors import ConfigError
from smockron.registry import Registry

if TYPE_CHECKING:
    from smockron.master.stores.base import Store

LAYOUTS = ("smockron", "original")
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "redis+cluster")
MULTI_HOST = ("redis+sentinel", "redis+cluster")
DEFAULT_PORTS = {"redis+sentinel": 26379, "redis+cluster": 6379}


@dataclass(frozen=True, slots=True)
class StoreURI:
    """A checked store URI: its scheme, the URI for the client, and the key layout."""

    scheme: str
    client_uri: str
    layout: str = "smockron"
    hosts: tuple[tuple[str, int], ...] = ()
    """Sentinels or cluster nodes (multi-host schemes only)."""
    service: str = ""
    """The Sentinel's name for the master (``redis+sentinel`` only)."""
    db: int = 0
    username: str | None = None
    password: str | None = None


class StoreClass(Protocol):
    """What a store class registered in :data:`STORES` offers."""

    schemes: ClassVar[tuple[str, ...]]

    @classmethod
    def open(cls, uri: StoreURI, snapshot: str | None, snapshot_interval: float) -> Store:
        """The store ``uri`` (checked) names; ``snapshot`` is the memory store's file."""
        ...


STORES: Registry[StoreClass] = Registry(
    "store scheme",
    {"memory": "smockron.master.stores.memory"}
    | {scheme: "smockron.master.stores.redis" for scheme in REDIS_SCHEMES},
)


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
    if scheme in MULTI_HOST:
        return _parse_multi_host(uri, scheme)
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


def _parse_multi_host(uri: str, scheme: str) -> StoreURI:
    """``redis+sentinel://[:PW@]H:P,H:P/SERVICE[/DB]`` or ``redis+cluster://[:PW@]H:P,H:P``."""
    rest = uri.partition("://")[2]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    options = parse_qsl(query, keep_blank_values=True)
    if any(name == "layout" and value != "smockron" for name, value in options):
        raise ConfigError(f"store {uri!r}: the original layout needs a plain redis:// URI")
    userinfo, _, hostlist = netloc.rpartition("@")
    username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    hosts = []
    for item in hostlist.split(","):
        if not item:
            raise ConfigError(f"store {uri!r} names no host: use {scheme}://HOST:PORT,HOST:PORT")
        _check_host_port_db(uri, item, "")
        host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
        hosts.append((host.strip("[]"), int(port) if port else DEFAULT_PORTS[scheme]))
    parts = [part for part in path.split("/") if part]
    service, db = "", "0"
    if scheme == "redis+sentinel":
        if not parts or len(parts) > 2:
            raise ConfigError(f"store {uri!r} names no service: use {scheme}://HOST:PORT/SERVICE")
        service, db = parts[0], parts[1] if len(parts) == 2 else "0"
    elif parts:
        raise ConfigError(f"store {uri!r}: a Redis Cluster has no database or service path")
    if not (db.isdigit() and db.isascii()):
        raise ConfigError(f"store {uri!r}: database {db!r} is not a number")
    return StoreURI(
        scheme, uri, "smockron", tuple(hosts), service, int(db), username or None, password or None
    )


def redacted(uri: str) -> str:
    """``uri`` with its password replaced, for log lines and metrics."""
    scheme, sep, rest = uri.partition("://")
    userinfo, at, hosts = rest.partition("@")
    if not at or "/" in userinfo:
        return uri
    user, colon, _password = userinfo.partition(":")
    return f"{scheme}{sep}{user}{':***' if colon else ''}@{hosts}"
