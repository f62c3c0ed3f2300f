"""Does a client certificate carry the name GRPC_CLIENT_TLS_SAN asks for?

envoyproxy/ratelimit verifies the client certificate again with ``x509.VerifyOptions{
DNSName: GRPC_CLIENT_TLS_SAN}``, so the test is Go's ``Certificate.VerifyHostname``, and
this module is that function over the names a TLS stack reports: an IP address (optionally
in brackets) matches the certificate's IP SANs only; any other name matches its DNS SANs,
ASCII case-insensitively, with a left-most ``*`` label and a trailing dot allowed when both
are valid host names (otherwise only an exact match counts). The subject's Common Name is
never looked at. Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

_UPPER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_LABEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")

IP = ipaddress.IPv4Address | ipaddress.IPv6Address


def _lower(text: str) -> str:
    """Go's toLowerCaseASCII: only A-Z change."""
    return text.translate(_UPPER)


def _ip(text: str) -> IP | None:
    """Go's net.ParseIP, an IPv4-mapped IPv6 address taken as the IPv4 one (net.IP.Equal)."""
    if "%" in text:  # a zone is not an address to net.ParseIP
        return None
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _valid_hostname(host: str, pattern: bool) -> bool:
    if not pattern and host.endswith("."):
        host = host[:-1]
    if not host:
        return False
    for i, label in enumerate(host.split(".")):
        if not label:
            return False
        if pattern and i == 0 and label == "*":
            continue
        if label[0] == "-" or not set(label) <= _LABEL_CHARS:
            return False
    return True


def _match_exactly(a: str, b: str) -> bool:
    if a in ("", ".") or b in ("", "."):
        return False
    return _lower(a) == _lower(b)


def _match_hostnames(pattern: str, host: str) -> bool:
    pattern = _lower(pattern)
    host = _lower(host[:-1] if host.endswith(".") else host)
    if not pattern or not host:
        return False
    wanted, got = pattern.split("."), host.split(".")
    if len(wanted) != len(got):
        return False
    pairs = enumerate(zip(wanted, got, strict=True))
    return all((i == 0 and w == "*") or w == g for i, (w, g) in pairs)


def mismatch(wanted: str, dns_names: Sequence[str], ip_names: Sequence[str]) -> str | None:
    """None when a certificate with these SANs is valid for ``wanted``; else Go's error
    text (``x509: certificate is valid for a, b, not c``), which upstream logs."""
    bracketed = len(wanted) >= 3 and wanted[0] == "[" and wanted[-1] == "]"
    candidate = wanted[1:-1] if bracketed else wanted
    address = _ip(candidate)
    if address is not None:
        ips = [ip for ip in (_ip(name) for name in ip_names) if ip is not None]
        if address in ips:
            return None
        if not ips:
            return (
                f"x509: cannot validate certificate for {candidate} "
                "because it doesn't contain any IP SANs"
            )
        return f"x509: certificate is valid for {', '.join(map(str, ips))}, not {candidate}"
    name = _lower(wanted)
    valid_name = _valid_hostname(name, pattern=False)
    for san in dns_names:
        if valid_name and _valid_hostname(san, pattern=True):
            if _match_hostnames(san, name):
                return None
        elif _match_exactly(san, name):
            return None
    if not dns_names:
        return f"x509: certificate is not valid for any names, but wanted to match {wanted}"
    return f"x509: certificate is valid for {', '.join(dns_names)}, not {wanted}"
