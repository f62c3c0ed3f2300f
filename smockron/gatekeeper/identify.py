"""Who is the client, and which domain does a request belong to.

The peer address is the default identifier. ``X-Forwarded-For`` and ``Forwarded`` are
believed only when the peer is a configured trusted proxy, and then only up to the first
hop that is not trusted: anything further left was written by the client and is forgeable.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping

from smockron.errors import ConfigError


class RequestInfo:
    """What identification needs from an HTTP request, whatever the server."""

    __slots__ = ("_lookup", "method", "path", "peer")

    def __init__(
        self,
        peer: str | None,
        method: str,
        path: str,
        lookup: Callable[[str], str | None] | None = None,
    ) -> None:
        self.peer = peer
        self.method = method
        self.path = path
        self._lookup = lookup

    def header(self, name: str) -> str | None:
        """A header by lower-case name; repeated headers are joined with ``", "``."""
        return self._lookup(name) if self._lookup is not None else None


Identify = Callable[[RequestInfo], "bytes | str | None"]
DomainOf = Callable[[RequestInfo], "str | None"]


def peer_address(req: RequestInfo) -> str | None:
    """The TCP peer's address: the only identity a client cannot forge."""
    return req.peer


def header(name: str, fallback: Identify = peer_address) -> Identify:
    """Identify by a header (say an API key), falling back to ``fallback`` when absent."""
    lname = name.lower()

    def identify(req: RequestInfo) -> bytes | str | None:
        value = req.header(lname)
        return value if value else fallback(req)

    return identify


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _parse_networks(trusted: Iterable[str]) -> tuple[Network, ...]:
    nets = []
    for item in trusted:
        try:
            nets.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError:
            raise ConfigError(f"trusted proxy {item!r} is not an address or CIDR network") from None
    return tuple(nets)


def _forwarded_for(value: str) -> list[str]:
    """The ``for=`` nodes of an RFC 7239 ``Forwarded`` header, in order."""
    out = []
    for element in value.split(","):
        for pair in element.split(";"):
            key, _, node = pair.strip().partition("=")
            if key.lower() == "for":
                out.append(_strip_node(node.strip().strip('"')))
    return out


def _strip_node(node: str) -> str:
    """``[2001:db8::1]:4711`` -> ``2001:db8::1``; ``192.0.2.1:80`` -> ``192.0.2.1``."""
    if node.startswith("["):
        return node[1 : node.find("]")] if "]" in node else node
    if node.count(":") == 1:
        return node.split(":", 1)[0]
    return node


class ForwardedFor:
    """Believe ``Forwarded`` / ``X-Forwarded-For`` only from ``trusted`` proxies."""

    def __init__(self, trusted: Iterable[str], fallback: Identify = peer_address) -> None:
        self.trusted = _parse_networks(trusted)
        if not self.trusted:
            raise ConfigError("ForwardedFor needs at least one trusted proxy address")
        self.fallback = fallback

    def is_trusted(self, address: str | None) -> bool:
        if not address:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self.trusted)

    def __call__(self, req: RequestInfo) -> bytes | str | None:
        if not self.is_trusted(req.peer):
            return self.fallback(req)
        forwarded = req.header("forwarded")
        if forwarded:
            hops = _forwarded_for(forwarded)
        else:
            xff = req.header("x-forwarded-for") or ""
            hops = [_strip_node(h.strip()) for h in xff.split(",") if h.strip()]
        if not hops:
            return self.fallback(req)
        for hop in reversed(hops):  # right to left: nearest proxy first
            if not self.is_trusted(hop):
                return hop
        return hops[0]  # every hop is one of ours: the leftmost is the client


def as_identifier(value: bytes | str | None) -> bytes | None:
    """Identifier bytes, whole: one longer than a master accepts is replaced by its
    digest where every gatekeeper decides (``Gatekeeper.decide``), not cut here."""
    if value is None:
        return None
    return value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value


def parse_identify(spec: str, trusted: Iterable[str] = ()) -> Identify:
    """The ``--identify`` flag: ``ip`` or ``header:NAME``; trusted proxies wrap either."""
    trusted = list(trusted)
    if spec == "ip":
        base: Identify = peer_address
    elif spec.startswith("header:") and len(spec) > len("header:"):
        base = header(spec.split(":", 1)[1])
    else:
        raise ConfigError(f"cannot parse --identify {spec!r}: use ip or header:NAME")
    if not trusted:
        return base
    forwarded = ForwardedFor(trusted)
    if base is peer_address:
        return forwarded
    return header(spec.split(":", 1)[1], fallback=forwarded)


def domain_resolver(
    domain: str | Mapping[str, str] | DomainOf,
) -> tuple[DomainOf, frozenset[str] | None]:
    """A function request -> domain (None: not limited), and the domains it can return.

    ``domain`` is a fixed name, a mapping of path prefix to domain (longest prefix
    wins; unmatched paths are not limited), or any callable. A callable's domains are
    unknown in advance (``None``), so its gatekeeper subscribes to every domain.
    """
    if isinstance(domain, str):
        fixed = domain

        def fixed_domain(req: RequestInfo) -> str | None:
            return fixed

        return fixed_domain, frozenset({fixed})
    if isinstance(domain, Mapping):
        routes = sorted(domain.items(), key=lambda kv: len(kv[0]), reverse=True)

        def route_domain(req: RequestInfo) -> str | None:
            path = req.path
            for prefix, name in routes:
                if path.startswith(prefix):
                    return name
            return None

        return route_domain, frozenset(domain.values())
    if callable(domain):
        return domain, None
    raise ConfigError(f"domain must be a name, a mapping or a callable, got {domain!r}")
