"""The ASGI and WSGI middlewares' metrics land in the registry they are given."""

from __future__ import annotations

import httpx
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from smockron.gatekeeper.asgi import Receive, Scope, Send, SmockronMiddleware
from smockron.gatekeeper.wsgi import Environ, SmockronWSGIMiddleware, StartResponse


async def _asgi_ok(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _wsgi_ok(environ: Environ, start_response: StartResponse) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


def _decisions(registry: CollectorRegistry) -> dict[str, float]:
    """Parsed from the exposition text, as Prometheus would read it."""
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name == "smockron_gatekeeper_decisions":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[sample.labels["verdict"]] = sample.value
    return out


async def test_asgi_middleware_metrics_in_the_given_registry() -> None:
    registry = CollectorRegistry()
    apps = [
        SmockronMiddleware(
            _asgi_ok, domain="api", rules={"api": ["1/s:3"]}, max_delay_ms=0, registry=registry
        )
        for _ in range(2)
    ]
    statuses = []
    for app in apps:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            statuses += [(await client.get("/")).status_code for _ in range(5)]
        await app.gatekeeper.aclose()
    assert statuses.count(200) == 6  # 3 each: the burst of the rule
    assert _decisions(registry) == {"accepted": 6.0, "delayed": 0.0, "rejected": 4.0}
    assert registry.get_sample_value("smockron_gatekeeper_fail_open_errors_total") == 0
    assert registry.get_sample_value("smockron_gatekeeper_abandoned_total") == 0
    assert registry.get_sample_value("smockron_gatekeeper_first_lines") == 2  # a gauge


def test_wsgi_middleware_metrics_in_the_given_registry() -> None:
    registry = CollectorRegistry()
    app = SmockronWSGIMiddleware(
        _wsgi_ok, domain="api", rules={"api": ["1/s:2"]}, max_delay_ms=0, registry=registry
    )
    try:
        with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://t") as client:
            statuses = [client.get("/").status_code for _ in range(5)]
    finally:
        app.close()
    assert statuses == [200, 200, 503, 503, 503]
    assert _decisions(registry) == {"accepted": 2.0, "delayed": 0.0, "rejected": 3.0}
    assert registry.get_sample_value("smockron_gatekeeper_accounting_dropped_total") == 5


def test_default_is_the_global_registry() -> None:
    def accepted() -> float:
        labels = {"verdict": "accepted"}
        return REGISTRY.get_sample_value("smockron_gatekeeper_decisions_total", labels) or 0.0

    before = accepted()
    app = SmockronWSGIMiddleware(_wsgi_ok, domain="api")
    try:
        with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://t") as client:
            assert client.get("/").status_code == 200
        assert accepted() == before + 1
    finally:
        app.close()
