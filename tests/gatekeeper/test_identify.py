"""Identification, domains and the rejection response: pure, no server needed."""

from __future__ import annotations

import json

import pytest

from smockron.errors import ConfigError
from smockron.gatekeeper.httpgate import HttpGate, http_loginfo, rejection, retry_after_s
from smockron.gatekeeper.identify import (
    ForwardedFor,
    RequestInfo,
    domain_resolver,
    header,
    parse_identify,
    peer_address,
)


def req(peer: str | None = "10.0.0.5", path: str = "/", **headers: str) -> RequestInfo:
    table = {k.replace("_", "-").lower(): v for k, v in headers.items()}
    return RequestInfo(peer, "GET", path, table.get)


TRUST = ForwardedFor(["10.0.0.0/8", "::1"])


def test_peer_is_default() -> None:
    assert peer_address(req(x_forwarded_for="6.6.6.6")) == "10.0.0.5"


def test_forwarded_for_from_untrusted_peer_is_ignored() -> None:
    assert TRUST(req(peer="203.0.113.9", x_forwarded_for="6.6.6.6")) == "203.0.113.9"


def test_forwarded_for_walks_right_to_left_past_trusted_hops() -> None:
    # client forged 6.6.6.6; our edge proxy appended the real client 198.51.100.7
    r = req(x_forwarded_for="6.6.6.6, 198.51.100.7, 10.1.2.3")
    assert TRUST(r) == "198.51.100.7"


def test_forwarded_header_rfc7239() -> None:
    r = req(forwarded='for="[2001:db8::17]:4711";proto=https, for=10.0.0.9:80')
    assert TRUST(r) == "2001:db8::17"
    assert TRUST(req(x_forwarded_for="10.0.0.7, 10.0.0.8")) == "10.0.0.7"
    assert TRUST(req()) == "10.0.0.5"  # trusted peer, no header


def test_header_identification_and_fallback() -> None:
    ident = header("X-API-Key")
    assert ident(req(x_api_key="k1")) == "k1"
    assert ident(req()) == "10.0.0.5"


def test_parse_identify() -> None:
    assert parse_identify("ip") is peer_address
    assert parse_identify("header:X-Key")(req(x_key="abc")) == "abc"
    combined = parse_identify("header:X-Key", ["10.0.0.0/8"])
    assert combined(req(x_forwarded_for="198.51.100.1")) == "198.51.100.1"
    assert parse_identify("ip", ["10.0.0.0/8"])(req(x_forwarded_for="1.2.3.4")) == "1.2.3.4"
    for bad in ("ipx", "header:", "cookie:x"):
        with pytest.raises(ConfigError):
            parse_identify(bad)
    with pytest.raises(ConfigError):
        ForwardedFor(["not-a-network"])


def test_domains_fixed_routes_callable() -> None:
    fixed, names = domain_resolver("api")
    assert fixed(req()) == "api" and names == frozenset({"api"})
    routes, names = domain_resolver({"/api": "api", "/api/search": "search"})
    assert routes(req(path="/api/search/x")) == "search"
    assert routes(req(path="/api/items")) == "api"
    assert routes(req(path="/static/x")) is None
    assert names == frozenset({"api", "search"})
    fn, names = domain_resolver(lambda r: r.path.split("/")[1] or None)
    assert fn(req(path="/users/1")) == "users" and names is None


def test_gate_resolve() -> None:
    gate = HttpGate({"/api": "api"}, header("x-key"), loginfo=http_loginfo)
    target = gate.resolve(req(path="/api/1", x_key="k" * 5000, user_agent="curl/8"))
    assert target is not None
    domain, identifier, loginfo = target
    assert domain == b"api" and identifier == b"k" * 5000  # whole: the gatekeeper digests it
    assert loginfo is not None and b"curl/8" in loginfo
    assert gate.resolve(req(path="/free")) is None
    nul = HttpGate(lambda r: "bad\0domain")
    assert nul.resolve(req()) is None
    with pytest.raises(ConfigError):
        HttpGate("api", reject_status=500)


@pytest.mark.parametrize(("wait_ms", "expected"), [(0, 1), (1, 1), (1000, 1), (1001, 2), (4500, 5)])
def test_retry_after_rounds_up(wait_ms: int, expected: int) -> None:
    assert retry_after_s(wait_ms) == expected


def test_rejection_bodies() -> None:
    plain = rejection(503, 1200, "text/html")
    assert plain.status_line == "503 Service Unavailable"
    assert dict(plain.headers)["retry-after"] == "2"
    assert dict(plain.headers)["content-type"].startswith("text/plain")
    problem = rejection(429, 10, "application/problem+json")
    assert dict(problem.headers)["content-type"] == "application/problem+json"
    doc = json.loads(problem.body)
    assert doc["status"] == 429 and doc["title"] == "Too Many Requests"
    assert dict(problem.headers)["content-length"] == str(len(problem.body))


def test_loginfo_carries_user_agent_and_referer_capped() -> None:
    info = http_loginfo(req(user_agent="curl/8", referer="https://example.org/page"))
    assert info == b"ua=curl/8 referer=https://example.org/page"
    assert http_loginfo(req()) == b"ua=- referer=-"
    assert len(http_loginfo(req(user_agent="x" * 10_000))) == 512


@pytest.mark.parametrize(
    ("accept", "problem"),
    [
        (None, False),
        ("", False),
        ("text/html, */*", False),
        ("application/problem+json", True),
        ("text/html;q=0.9, application/json", True),
        ("Application/Problem+JSON; q=0.5", True),
        ("application/problem+json;q=0, text/plain", False),  # explicitly refused
        ("application/json;q=0.0", False),
        ("application/json;q=bogus", False),
        ("application/jsonx, xapplication/json", False),  # no substring matching
        (";;;,,,=q;q=;", False),
    ],
)
def test_problem_json_follows_accept(accept: str | None, problem: bool) -> None:
    ctype = dict(rejection(503, 1000, accept).headers)["content-type"]
    assert (ctype == "application/problem+json") is problem


def test_loginfo_is_optional_or_any_callable() -> None:
    silent = HttpGate("api", loginfo=None).resolve(req(user_agent="curl/8"))
    assert silent == (b"api", b"10.0.0.5", None)
    custom = HttpGate("api", loginfo=lambda r: f"{r.method} {r.path}".encode())
    assert custom.resolve(req(path="/x")) == (b"api", b"10.0.0.5", b"GET /x")
