"""GRPC_CLIENT_TLS_SAN's name test (smockron.cluster.san) against Go's own cases.

envoyproxy/ratelimit checks the name with Go's ``Certificate.VerifyHostname``; these are the
tables of Go's crypto/x509 ``TestMatchHostnames`` and ``TestMatchIP``, on the names a TLS
stack reports for a certificate (its DNS SANs, its IP SANs).
"""

from __future__ import annotations

import pytest

from smockron.cluster.san import mismatch

# (certificate's DNS SAN, wanted name, valid) from Go's matchHostnamesTests
MATCH_HOSTNAMES = [
    ("a.b.c", "a.b.c", True),
    ("a.b.c", "b.b.c", False),
    ("", "b.b.c", False),
    ("a.b.c", "", False),
    ("example.com", "example.com", True),
    ("example.com", "www.example.com", False),
    ("*.example.com", "example.com", False),
    ("*.example.com", "www.example.com", True),
    ("*.example.com", "www.example.com.", True),
    ("*.example.com", "xyz.www.example.com", False),
    ("*.example.com", "https://www.example.com", False),
    ("*.example..com", "www.example..com", False),
    ("www.example..com", "www.example..com", True),
    ("*.*.example.com", "xyz.www.example.com", False),
    ("*.www.*.com", "xyz.www.example.com", False),
    ("*bar.example.com", "foobar.example.com", False),
    ("f*.example.com", "foobar.example.com", False),
    ("www.example.com", "*.example.com", False),
    ("", ".", False),
    (".", "", False),
    (".", ".", False),
    ("example.com", "example.com.", True),
    ("example.com.", "example.com", False),
    ("example.com.", "example.com.", True),
    ("*.com.", "example.com.", False),
    ("*.com.", "example.com", False),
    ("*.com", "example.com", True),
    ("*.com", "example.com.", True),
    ("foo:bar", "foo:bar", True),
    ("*.foo:bar", "xxx.foo:bar", False),
    ("*.2.3.4", "1.2.3.4", False),
    ("*.2.3.4", "[1.2.3.4]", False),
    ("*:4860:4860::8888", "2001:4860:4860::8888", False),
    ("*:4860:4860::8888", "[2001:4860:4860::8888]", False),
    ("2001:4860:4860::8888", "2001:4860:4860::8888", False),
    ("2001:4860:4860::8888", "[2001:4860:4860::8888]", False),
    ("[2001:4860:4860::8888]", "2001:4860:4860::8888", False),
    ("[2001:4860:4860::8888]", "[2001:4860:4860::8888]", False),
]


@pytest.mark.parametrize(("pattern", "host", "ok"), MATCH_HOSTNAMES)
def test_TestMatchHostnames(pattern: str, host: str, ok: bool) -> None:
    assert (mismatch(host, [pattern], []) is None) == ok


def test_TestMatchIP() -> None:
    assert mismatch("quux.foo.bar.baz", ["*.foo.bar.baz"], []) is None
    assert mismatch("1.2.3.4", ["*.2.3.4"], []) is not None
    for host in ("127.0.0.1", "::1", "[::1]"):
        assert mismatch(host, [], ["127.0.0.1", "::1"]) is None


def test_case_ip_forms_and_dns_names_only() -> None:
    """ASCII case is ignored; an IPv4-mapped IPv6 SAN is that IPv4 address (Go's
    net.IP.Equal); an IP is never looked for among DNS names, nor a name among IPs."""
    assert mismatch("LocalHost", ["localhost"], []) is None
    assert mismatch("localhost", ["*.LOCALHOST"], []) is not None
    assert mismatch("10.1.2.3", [], ["::ffff:10.1.2.3"]) is None
    assert mismatch("10.1.2.3", ["10.1.2.3"], []) is not None
    assert mismatch("localhost", [], ["127.0.0.1"]) is not None
    assert mismatch("fe80::1%eth0", ["fe80::1%eth0"], []) is None  # not an IP to Go


def test_go_error_text() -> None:
    """What upstream logs (``error validating client: ...``)."""
    assert mismatch("localhost", ["client", "other"], []) == (
        "x509: certificate is valid for client, other, not localhost"
    )
    assert mismatch("localhost", [], ["10.0.0.1"]) == (
        "x509: certificate is not valid for any names, but wanted to match localhost"
    )
    assert mismatch("10.0.0.2", ["host"], []) == (
        "x509: cannot validate certificate for 10.0.0.2 because it doesn't contain any IP SANs"
    )
    assert mismatch("[::2]", [], ["10.0.0.1", "::ffff:10.0.0.3"]) == (
        "x509: certificate is valid for 10.0.0.1, 10.0.0.3, not ::2"
    )
