"""The HTTP/JSON gateway, shaped like Gubernator's grpc-gateway.

Output: snake_case field names, zero values present, int64 as strings, enums by name
(``google.protobuf.json_format``). Input: camelCase or snake_case, numbers or strings,
enum names or numbers; unknown fields are ignored like grpc-gateway does. Errors use
grpc-gateway's body ``{"code": <grpc code>, "message": ..., "details": []}``. Malformed
input gets a 400 that says what is wrong, a counter, and a rate-limited log line; bytes
that are not HTTP are counted by ``server_log``, the logger the node's runners give aiohttp.
The counters are the node's (``smockron_cluster_http_malformed_total{reason}``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from aiohttp import web
from google.protobuf import json_format
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from smockron.cluster.api import TOO_MANY, answer, health_pb
from smockron.cluster.metrics import gubernator_exposition
from smockron.cluster.node import MAX_BATCH, Node
from smockron.cluster.pb import gubernator_pb2 as pb
from smockron.httplog import ServerLog
from smockron.observe import ObserveServer, Readiness, serve
from smockron.ratelog import RateLimitedLog

log = logging.getLogger("smockron.cluster.http")

MAX_BODY = 4 * 1024 * 1024
_INVALID_ARGUMENT = 3
_OUT_OF_RANGE = 11
_NODE: web.AppKey[Node] = web.AppKey("node", Node)


_bad_input_log = RateLimitedLog(log, interval=1.0)


def server_log(node: Node) -> ServerLog:
    """aiohttp's logger for the node's HTTP listeners (``web.AppRunner``'s ``logger``):
    requests that are not HTTP are counted on the node (``bad_http``), one line a while."""
    return ServerLog(log, lambda: node.metrics.http_malformed.labels("bad_http").inc())


def _error(status: int, code: int, message: str) -> web.Response:
    return web.json_response({"code": code, "message": message, "details": []}, status=status)


def _bad_request(request: web.Request, reason: str, message: str) -> web.Response:
    request.app[_NODE].metrics.http_malformed.labels(reason).inc()
    _bad_input_log.warning("bad request (%s): %s", reason, message)
    return _error(400, _INVALID_ARGUMENT, message)


_ENUMS = {"algorithm": pb.Algorithm, "behavior": pb.Behavior}


def _check_enum_names(items: object) -> None:
    """Reject unknown enum names, which ignore_unknown_fields would silently zero."""
    if not isinstance(items, list):
        return
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        for field, enum in _ENUMS.items():
            value = item.get(field)
            if isinstance(value, str) and value not in list(enum.keys()):
                names = ", ".join(enum.keys())
                raise ValueError(f"requests[{i}].{field}: unknown value {value!r} ({names})")


def _to_json(msg: Any) -> dict[str, Any]:
    out: dict[str, Any] = json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return out


async def get_rate_limits(request: web.Request) -> web.Response:
    body = await request.read()
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return _bad_request(request, "bad_json", f"request body is not valid JSON: {exc}")
    except RecursionError:  # json's decoder recurses: thousands of nested [ or {
        return _bad_request(request, "bad_json", "request body is nested too deeply")
    if not isinstance(data, dict):
        return _bad_request(
            request, "bad_json", "request body must be a JSON object with 'requests'"
        )
    if b"\\u" in body and _lone_surrogate(data):  # only an escape can make one
        return _bad_request(request, "bad_json", "request body has a lone UTF-16 surrogate")
    msg = pb.GetRateLimitsReq()
    try:
        _check_enum_names(data.get("requests"))
        json_format.ParseDict(data, msg, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        return _bad_request(request, "bad_fields", f"invalid GetRateLimitsReq: {exc}")
    node = request.app[_NODE]
    if len(msg.requests) > MAX_BATCH:
        node.metrics.check_errors.labels("Request too large").inc()
        return _error(400, _OUT_OF_RANGE, TOO_MANY)
    resps = await answer(node, msg.requests)
    return web.json_response(_to_json(pb.GetRateLimitsResp(responses=resps)))


def _lone_surrogate(data: object) -> bool:
    """Whether decoded JSON holds a string with a lone surrogate (``"\\udca1"`` is valid
    JSON, but no UTF-8): protobuf's parser fails on one in a field name with a
    SystemError, not a ParseError."""
    try:
        json.dumps(data, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return True
    return False


async def health_check(request: web.Request) -> web.Response:
    return web.json_response(_to_json(health_pb(request.app[_NODE])))


async def live_check(request: web.Request) -> web.Response:
    return web.json_response({})


def readiness(node: Node) -> Readiness:
    """Ready: peers listed, and this node among them (in the ring)."""
    return Readiness(
        {
            "peers": lambda: None if node.peer_infos else "no peers listed yet",
            "ring": lambda: None if node.in_peer_list else f"{node.address} is not in the ring",
        }
    )


class _Both:
    """The process's metrics, then the node's own, as one collector (what /metrics on
    the gateway serves, for the ``--metrics`` listener)."""

    def __init__(self, node: Node) -> None:
        self._node = node

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()
        yield from self._node.metrics.registry.collect()


def observe(node: Node, address: str) -> ObserveServer:
    """The ``--metrics`` listener: the process's and the node's metrics, /healthz, /readyz."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Both(node))
    return serve(address, readiness(node), registry)


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")  # answered: the loop is alive


async def readyz(request: web.Request) -> web.Response:
    checks = readiness(request.app[_NODE])
    failing = checks.failing()
    if failing:
        return web.json_response({"ready": False, "failing": failing}, status=503)
    return web.json_response({"ready": True, "checks": checks.names})


async def metrics(request: web.Request) -> web.Response:
    """The process's counters, then the node's own (smockron.cluster.metrics), then
    Gubernator's names for them, where Gubernator serves its metrics."""
    node = request.app[_NODE]
    node.count_relayed()
    body = generate_latest() + generate_latest(node.metrics.registry)
    body += gubernator_exposition(
        node.metrics,
        len(node.limiter),
        node.limiter.stats(),
        global_queues=node.global_sync.queued(),
        batch_queues={addr: client.queued for addr, client in node.clients.items()},
    )
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def make_status_app(node: Node) -> web.Application:
    """Only /v1/HealthCheck: Gubernator's status listener (GUBER_STATUS_HTTP_ADDRESS)."""
    app = web.Application(client_max_size=MAX_BODY)
    app[_NODE] = node
    app.router.add_get("/v1/HealthCheck", health_check)
    return app


def make_app(node: Node) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY)
    app[_NODE] = node
    app.router.add_post("/v1/GetRateLimits", get_rate_limits)
    app.router.add_get("/v1/HealthCheck", health_check)
    app.router.add_get("/v1/LiveCheck", live_check)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app
