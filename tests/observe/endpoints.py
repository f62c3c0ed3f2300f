"""Reading a daemon's observability listener, as a probe or Prometheus would."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.support import wait_for


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def readyz(port: int) -> tuple[int, dict[str, Any]]:
    status, body = get(port, "/readyz")
    return status, json.loads(body)


def wait_ready(port: int, timeout: float = 15.0) -> None:
    wait_for(lambda: _ready(port), timeout, 0.1)


def _ready(port: int) -> bool:
    try:
        return readyz(port)[0] == 200
    except OSError:
        return False


def samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, parsed by prometheus_client's parser."""
    status, body = get(port, "/metrics")
    assert status == 200
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def sample(port: int, name: str, **labels: str) -> float | None:
    return samples(port).get((name, tuple(sorted(labels.items()))))


def assert_probes(port: int) -> None:
    """Live, ready, and a 404 for what is not an endpoint."""
    assert get(port, "/healthz") == (200, b"ok\n")
    status, body = readyz(port)
    assert status == 200 and body["ready"] is True, body
    assert get(port, "/")[0] == 404
    assert get(port, "/nope")[0] == 404
