"""envoyproxy/ratelimit's service behaviour, ported to real ``smockron cluster`` processes.

Tests carry the name of the upstream test whose facts they check: ``test/service/
ratelimit_test.go`` (there with a mocked cache: here the limits are driven over their
limit with hits), ``test/redis/fixed_cache_impl_test.go`` ``TestNearLimit`` (the counts and
the stats split of the fixed window), and ``integration-test/scripts/replaces.sh`` (upstream's
``examples/ratelimit/config/example.yaml`` through Envoy's descriptors). Each cluster is two
nodes started with the variables a group of tests needs; calls go to the first node, whose
``/metrics`` carry the counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import grpc
import pytest
from google.protobuf import json_format
from prometheus_client.parser import text_string_to_metric_families

from smockron.cluster.envoy.pb import ratelimit_pb2, ratelimit_unit_pb2, rls_pb2, rls_pb2_grpc
from tests.cluster.test_cluster import start_cluster

UPSTREAM = Path(__file__).parent / "envoy" / "upstream"
Resp = rls_pb2.RateLimitResponse
OK, OVER = Resp.OK, Resp.OVER_LIMIT
MAX_UINT32 = 2**32 - 1

CONFIG = """
domain: svc
descriptors:
  - key: limited
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10, name: key_name}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: regular
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: meta
    rate_limit: {unit: minute, requests_per_unit: 10}
    metadata: {name: service_1}
  - key: meta_other
    rate_limit: {unit: minute, requests_per_unit: 5}
    metadata: {some_other_name: service_2}
  - key: meta_same
    rate_limit: {unit: minute, requests_per_unit: 5}
    metadata: {name: service_2}
  - key: unlimited
    rate_limit: {unlimited: true}
  - key: weekly
    rate_limit: {unit: week, requests_per_unit: 2}
  - key: monthly
    rate_limit: {unit: month, requests_per_unit: 2}
  - key: near15
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 15}
  - key: near20
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 20}
  - key: near8
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 8}
  - key: near10
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 10}
"""


@dataclass
class Front:
    stub: rls_pb2_grpc.RateLimitServiceStub
    metrics_url: str

    async def ask(
        self, domain: str, *descriptors: ratelimit_pb2.RateLimitDescriptor, hits: int = 0
    ) -> rls_pb2.RateLimitResponse:
        request = rls_pb2.RateLimitRequest(domain=domain, descriptors=descriptors, hits_addend=hits)
        response: rls_pb2.RateLimitResponse = await self.stub.ShouldRateLimit(request, timeout=5)
        return response

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        async with aiohttp.ClientSession() as http, http.get(self.metrics_url) as r:
            text = await r.text()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }


def desc(
    *entries: tuple[str, str], hits: int | None = None, limit: tuple[int, int] | None = None
) -> ratelimit_pb2.RateLimitDescriptor:
    d = ratelimit_pb2.RateLimitDescriptor()
    for key, value in entries:
        d.entries.add(key=key, value=value)
    if hits is not None:
        d.hits_addend.value = hits
    if limit is not None:
        d.limit.requests_per_unit, d.limit.unit = limit  # type: ignore[assignment]
    return d


def uid() -> str:
    return uuid.uuid4().hex[:12]


@contextlib.contextmanager
def envoy_cluster(tmp: Path, env: dict[str, str]) -> Iterator[tuple[str, int]]:
    conf = tmp / "conf"
    conf.mkdir()
    (conf / "svc.yaml").write_text(CONFIG)
    for example in (UPSTREAM / "examples").iterdir():
        (conf / example.name).write_bytes(example.read_bytes())
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        starting = start_cluster(tmp, "--envoy-config", str(conf), nodes=2)
        cluster = starting.__enter__()
    try:
        yield cluster.addresses[0], cluster.http_ports[0]
    finally:
        starting.__exit__(None, None, None)


async def front_for(address: str, http_port: int) -> AsyncIterator[Front]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)  # type: ignore[no-untyped-call]
        yield Front(stub, f"http://127.0.0.1:{http_port}/metrics")


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """Upstream's defaults, with LIMIT_RESPONSE_HEADERS_ENABLED."""
    env = {"LIMIT_RESPONSE_HEADERS_ENABLED": "true"}
    with envoy_cluster(tmp_path_factory.mktemp("plain"), env) as c:
        yield c


@pytest.fixture(scope="module")
def shadow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    with envoy_cluster(tmp_path_factory.mktemp("shadow"), {"SHADOW_MODE": "true"}) as c:
        yield c


@pytest.fixture(scope="module")
def quota(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    env = {
        "QUOTA_MODE": "true",
        "RESPONSE_DYNAMIC_METADATA": "true",
        "LIMIT_RESPONSE_HEADERS_ENABLED": "true",
        "LIMIT_LIMIT_HEADER": "A-Ratelimit-Limit",
        "LIMIT_REMAINING_HEADER": "A-Ratelimit-Remaining",
        "LIMIT_RESET_HEADER": "A-Ratelimit-Reset",
    }
    with envoy_cluster(tmp_path_factory.mktemp("quota"), env) as c:
        yield c


@pytest.fixture
async def front(plain: tuple[str, int]) -> AsyncIterator[Front]:
    async for f in front_for(*plain):
        yield f


@pytest.fixture
async def shadow_front(shadow: tuple[str, int]) -> AsyncIterator[Front]:
    async for f in front_for(*shadow):
        yield f


@pytest.fixture
async def quota_front(quota: tuple[str, int]) -> AsyncIterator[Front]:
    async for f in front_for(*quota):
        yield f


async def clear_of(window_s: int, margin: float = 3.0) -> None:
    """Wait until the current ``window_s`` window has ``margin`` seconds left at least."""
    left = window_s - time.time() % window_s
    if left < margin:
        await asyncio.sleep(left + 0.05)


def codes(response: rls_pb2.RateLimitResponse) -> list[int]:
    return [s.code for s in response.statuses]


# -- test/service/ratelimit_test.go -------------------------------------------------------------


async def test_TestService(front: Front) -> None:
    await clear_of(60)
    limited, hello = desc(("limited", uid()), hits=11), desc(("hello", "world"))
    r = await front.ask("svc", limited, hello)
    assert r.overall_code == OVER and codes(r) == [OVER, OK]
    first, second = r.statuses
    assert (first.current_limit.requests_per_unit, first.current_limit.unit) == (
        10,
        Resp.RateLimit.MINUTE,
    )
    assert first.current_limit.name == "key_name" and first.limit_remaining == 0
    assert not second.HasField("current_limit") and second.limit_remaining == 0
    # Order does not matter.
    r = await front.ask("svc", hello, desc(("limited", uid()), hits=11))
    assert r.overall_code == OVER and codes(r) == [OK, OVER]
    # A domain nobody configured: every descriptor OK, no limit.
    r = await front.ask("test-domain", desc(("hello", "world")))
    assert r.overall_code == OK and not r.statuses[0].HasField("current_limit")


async def test_TestRuleShadowMode(front: Front) -> None:
    await clear_of(60)
    value = uid()
    r = await front.ask(
        "svc", desc(("shadowed", value), hits=11), desc(("shadowed", value + "b"), hits=11)
    )
    assert r.overall_code == OK and codes(r) == [OK, OK]
    assert [s.limit_remaining for s in r.statuses] == [0, 0]


async def test_TestMixedRuleShadowMode(front: Front) -> None:
    await clear_of(60)
    r = await front.ask(
        "svc", desc(("shadowed", uid()), hits=11), desc(("limited", uid()), hits=11)
    )
    assert r.overall_code == OVER and codes(r) == [OK, OVER]


async def test_TestServiceWithDefaultRatelimitHeaders(front: Front) -> None:
    await clear_of(60)
    r = await front.ask("svc", desc(("limited", uid()), hits=11), desc(("hello", "world")))
    assert r.overall_code == OVER
    headers = [(h.key, h.value) for h in r.response_headers_to_add]
    reset = 60 - int(time.time()) % 60
    assert headers[:2] == [("RateLimit-Limit", "10"), ("RateLimit-Remaining", "0")]
    assert headers[2][0] == "RateLimit-Reset" and abs(int(headers[2][1]) - reset) <= 1
    assert int(headers[2][1]) == r.statuses[0].duration_until_reset.seconds
    # Not over: the limited descriptor with the least remaining speaks.
    a, b = uid(), uid()
    await front.ask("svc", desc(("limited", b), hits=6))
    r = await front.ask("svc", desc(("limited", a)), desc(("limited", b)))
    assert [(h.key, h.value) for h in r.response_headers_to_add][:2] == [
        ("RateLimit-Limit", "10"),
        ("RateLimit-Remaining", "3"),
    ]


@pytest.mark.parametrize(
    ("domain", "descriptors", "message"),
    [
        pytest.param(
            "",
            [desc(("hello", "world"))],
            "rate limit domain must not be empty",
            id="TestEmptyDomain",
        ),
        pytest.param(
            "svc", [], "rate limit descriptor list must not be empty", id="TestEmptyDescriptors"
        ),
    ],
)
async def test_TestEmptyDomain_TestEmptyDescriptors(
    front: Front, domain: str, descriptors: list[ratelimit_pb2.RateLimitDescriptor], message: str
) -> None:
    key = ("ratelimit_service_should_rate_limit_error_total", (("err_type", "service_error"),))
    before = (await front.metrics())[key]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await front.ask(domain, *descriptors)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == message
    assert (await front.metrics())[key] == before + 1


async def test_TestUnlimited(front: Front) -> None:
    await clear_of(60)
    r = await front.ask(
        "svc", desc(("limited", uid())), desc(("hello", "world")), desc(("unlimited", "x")), hits=1
    )
    assert r.overall_code == OK and codes(r) == [OK, OK, OK]
    assert [s.limit_remaining for s in r.statuses] == [9, 0, MAX_UINT32]
    assert [s.HasField("current_limit") for s in r.statuses] == [True, False, False]


QUOTA_CASES = [
    # (upstream test, descriptors as (key, hits), overall code, codes)
    ("TestServicePerDescriptorQuotaMode", [("regular", 6), ("quota", 1)], OVER, [OVER, OK]),
    ("TestServiceMixedPerDescriptorModes", [("regular", 1), ("quota", 4)], OVER, [OK, OVER]),
    ("TestServiceMixedPerDescriptorModesUnderLimit", [("regular", 1), ("quota", 1)], OK, [OK, OK]),
    ("TestServiceQuotaModeOnlyAllOverTheLimit", [("quota", 4), ("quota", 4)], OVER, [OVER, OVER]),
    ("TestServiceQuotaModeOnlySomeOverTheLimit", [("quota", 4), ("quota", 1)], OK, [OVER, OK]),
]


@pytest.mark.parametrize(
    ("descriptors", "overall", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in QUOTA_CASES],
)
async def test_per_descriptor_quota_mode(
    front: Front, descriptors: list[tuple[str, int]], overall: int, expected: list[int]
) -> None:
    """TestServicePerDescriptorQuotaMode, TestServiceMixedPerDescriptorModes(UnderLimit),
    TestServiceQuotaModeOnlyAllOverTheLimit, TestServiceQuotaModeOnlySomeOverTheLimit."""
    await clear_of(60)
    r = await front.ask("svc", *(desc((key, uid()), hits=hits) for key, hits in descriptors))
    assert (r.overall_code, codes(r)) == (overall, expected)


async def test_TestServiceGlobalShadowMode(shadow_front: Front) -> None:
    await clear_of(60)
    key = ("ratelimit_service_global_shadow_mode_total", ())
    before = (await shadow_front.metrics())[key]
    r = await shadow_front.ask("svc", desc(("limited", uid()), hits=11), desc(("hello", "world")))
    assert r.overall_code == OK and codes(r) == [OVER, OK]
    metrics = await shadow_front.metrics()
    assert metrics[key] == before + 1
    assert metrics["ratelimit_service_config_load_success_total", ()] >= 1
    assert metrics["ratelimit_service_config_load_error_total", ()] == 0


@pytest.mark.parametrize(
    "keys",
    [
        pytest.param(["quota", "quota"], id="TestServiceQuotaModeWithShadowMode"),
        pytest.param(["regular", "quota"], id="TestServiceMixedModeWithShadowMode"),
    ],
)
async def test_quota_mode_with_global_shadow_mode(shadow_front: Front, keys: list[str]) -> None:
    await clear_of(60)
    key = ("ratelimit_service_global_shadow_mode_total", ())
    before = (await shadow_front.metrics())[key]
    r = await shadow_front.ask("svc", *(desc((k, uid()), hits=6) for k in keys))
    assert r.overall_code == OK and codes(r) == [OVER, OVER]
    assert (await shadow_front.metrics())[key] == before + 1


async def test_TestServiceGlobalQuotaMode(quota_front: Front) -> None:
    await clear_of(60)
    r = await quota_front.ask(
        "svc", desc(("limited", uid()), hits=11), desc(("regular", uid()), hits=6)
    )
    assert r.overall_code == OVER and codes(r) == [OVER, OVER]
    r = await quota_front.ask("svc", desc(("limited", uid()), hits=11), desc(("regular", uid())))
    assert r.overall_code == OK and codes(r) == [OVER, OK]


async def test_TestServiceWithCustomRatelimitHeaders(quota_front: Front) -> None:
    await clear_of(60)
    r = await quota_front.ask("svc", desc(("regular", uid()), hits=2), desc(("hello", "world")))
    headers = [(h.key, h.value) for h in r.response_headers_to_add]
    assert [k for k, _ in headers] == [
        "A-Ratelimit-Limit",
        "A-Ratelimit-Remaining",
        "A-Ratelimit-Reset",
    ]
    assert [v for _, v in headers[:2]] == ["5", "3"]


METADATA_CASES = [
    # (upstream test, descriptors (key, hits), the merged metadata of the passed ones)
    (
        "TestMetadataReturnedForPassedDescriptors",
        [("meta", 1), ("quota", 4)],
        {"name": "service_1"},
    ),
    (
        "TestMetadataReturnedForAllPassedDescriptors",
        [("meta", 1), ("meta_other", 1)],
        {"name": "service_1", "some_other_name": "service_2"},
    ),
    (
        "TestOverlappingMetadataReturnsTheFirstValue",
        [("meta", 1), ("meta_same", 1)],
        {"name": "service_1"},
    ),
]


@pytest.mark.parametrize(
    ("descriptors", "metadata"), [pytest.param(*case[1:], id=case[0]) for case in METADATA_CASES]
)
async def test_response_dynamic_metadata(
    quota_front: Front, descriptors: list[tuple[str, int]], metadata: dict[str, str]
) -> None:
    """TestMetadataReturnedForPassedDescriptors, TestMetadataReturnedForAllPassedDescriptors,
    TestOverlappingMetadataReturnsTheFirstValue (QUOTA_MODE and RESPONSE_DYNAMIC_METADATA)."""
    await clear_of(60)
    values = [uid() for _ in descriptors]
    r = await quota_front.ask(
        "svc",
        *(desc((k, v), hits=h) for (k, h), v in zip(descriptors, values, strict=True)),
        hits=1,
    )
    assert r.overall_code == OK
    got = json_format.MessageToDict(r.dynamic_metadata)
    assert got["metadata"] == metadata
    assert got["domain"] == "svc" and got["hitsAddend"] == 1
    assert [d["entries"] for d in got["descriptors"]] == [
        [f"{k}={v}"] for (k, _), v in zip(descriptors, values, strict=True)
    ]


# -- the limit override (config_impl.go GetLimit) ----------------------------------------------


async def test_limit_override_only_for_a_known_domain(front: Front) -> None:
    await clear_of(60)
    override = (1, ratelimit_unit_pb2.MINUTE)
    unknown = [
        (await front.ask("elsewhere", desc(("any", uid()), limit=override))) for _ in range(2)
    ]
    assert [r.overall_code for r in unknown] == [OK, OK]
    assert not unknown[0].statuses[0].HasField("current_limit")
    value = uid()
    known = [
        (await front.ask("svc", desc(("not_configured", value), limit=override))) for _ in range(2)
    ]
    assert [r.overall_code for r in known] == [OK, OVER]
    assert known[0].statuses[0].current_limit.requests_per_unit == 1
    # Deliberate difference: an override with an unknown unit is ignored (upstream panics).
    r = await front.ask("svc", desc(("limited", uid()), limit=(1, ratelimit_unit_pb2.UNKNOWN)))
    assert r.overall_code == OK and r.statuses[0].current_limit.requests_per_unit == 10


async def test_week_unit(front: Front) -> None:
    value = uid()
    got = [await front.ask("svc", desc(("weekly", value))) for _ in range(3)]
    assert [r.overall_code for r in got] == [OK, OK, OVER]
    status = got[0].statuses[0]
    assert status.current_limit.unit == Resp.RateLimit.WEEK
    # Upstream's week: 7-day windows counted from the epoch (Thursday 00:00 UTC).
    expected = 7 * 86_400 - int(time.time()) % (7 * 86_400)
    assert abs(status.duration_until_reset.seconds - expected) <= 1


async def test_month_is_a_calendar_month(front: Front) -> None:
    """Deliberate difference: upstream's month is 30 days counted from 1970-01-01."""
    r = await front.ask("svc", desc(("monthly", uid())))
    now = datetime.now(UTC)
    year, month = divmod(now.year * 12 + now.month, 12)
    next_month = datetime(year, month + 1, 1, tzinfo=UTC)
    expected = (next_month - now).total_seconds()
    assert r.statuses[0].current_limit.unit == Resp.RateLimit.MONTH
    assert abs(r.statuses[0].duration_until_reset.seconds - expected) <= 2


async def test_dynamic_metadata_limit_is_python_protobuf_text(quota_front: Front) -> None:
    """Deliberate difference: the override is shown as Python's protobuf text format."""
    r = await quota_front.ask("svc", desc(("meta", uid()), limit=(10, ratelimit_unit_pb2.DAY)))
    got = json_format.MessageToDict(r.dynamic_metadata)
    assert got["descriptors"][0]["limit"] == "requests_per_unit: 10 unit: DAY"


# -- test/redis/fixed_cache_impl_test.go TestNearLimit ------------------------------------------

NEAR = [
    # (key, count before, hits, code, limit_remaining, stats delta (total, over, near, within))
    ("near15", 10, 1, OK, 4, (1, 0, 0, 1)),  # under the near-limit ratio (0.8: 12 of 15)
    ("near15", 12, 1, OK, 2, (1, 0, 1, 1)),  # at the ratio: near_limit, still OK
    ("near15", 15, 1, OVER, 0, (1, 1, 0, 0)),  # over: near_limit no longer grows
    ("near20", 2, 3, OK, 15, (3, 0, 0, 3)),  # hits_addend > 1, all under near
    ("near8", 5, 2, OK, 1, (2, 0, 1, 2)),  # some over near
    ("near20", 16, 3, OK, 1, (3, 0, 3, 3)),  # all over near
    ("near20", 19, 3, OVER, 0, (3, 2, 1, 0)),  # some over the limit
    ("near20", 15, 7, OVER, 0, (7, 2, 4, 0)),  # some in all three places
    ("near10", 10, 3, OVER, 0, (3, 3, 0, 0)),  # all over the limit
]
STATS = ("total_hits", "over_limit", "near_limit", "within_limit")


@pytest.mark.parametrize(("key", "before", "hits", "code", "remaining", "delta"), NEAR)
async def test_TestNearLimit(
    front: Front,
    key: str,
    before: int,
    hits: int,
    code: int,
    remaining: int,
    delta: tuple[int, int, int, int],
) -> None:
    await clear_of(3600)
    value = uid()
    if before:
        assert (await front.ask("svc", desc((key, value), hits=before))).overall_code == OK
    labels = (("domain", "svc"), ("key1", f"{key}_{value}"), ("key2", ""))
    names = [f"ratelimit_service_rate_limit_{s}_total" for s in STATS]
    start = await front.metrics()
    r = await front.ask("svc", desc((key, value)), hits=hits)
    assert (r.overall_code, r.statuses[0].limit_remaining) == (code, remaining)
    end = await front.metrics()
    got = tuple(int(end.get((n, labels), 0) - start.get((n, labels), 0)) for n in names)
    assert got == delta
    if code == OVER:  # refused hits count: the window stays over for a single hit
        again = await front.ask("svc", desc((key, value)))
        assert (again.overall_code, again.statuses[0].limit_remaining) == (OVER, 0)
        # Deliberate difference: a 0-hit query is OK with 0 left (upstream: OVER_LIMIT).
        query = await front.ask("svc", desc((key, value), hits=0))
        assert (query.overall_code, query.statuses[0].limit_remaining) == (OK, 0)


# -- integration-test/scripts: upstream's example.yaml through Envoy's descriptors ---------------


def four(foo: str, bar: str, dest: str) -> list[ratelimit_pb2.RateLimitDescriptor]:
    return [
        desc(("foo", foo), ("bar", bar)),
        desc(("source_cluster", "proxy"), ("destination_cluster", dest)),
    ]


async def test_replaces_sh(front: Front) -> None:
    """replaces.sh: a limit named in a matched limit's ``replaces`` is not checked."""
    await clear_of(60, margin=5)
    steps = [
        ([desc(("foo", "bkthomps"), ("bar", "banned"))], OVER),
        (four("bkthomps", "banned", "mock"), OVER),
        (four("bkthomps", "banned", "override"), OK),
        (four("bkthomps", "banned", "override"), OK),
        (four("bkthomps", "banned", "override"), OVER),
        (four("my_foo", "bkthomps", "bkthomps"), OK),
        (four("my_foo", "bkthomps", "bkthomps"), OK),
        (four("my_foo", "bkthomps", "bkthomps"), OVER),
        (four("my_foo", "bkthomps", "not_bkthomps"), OK),
        (four("my_foo", "bkthomps", "not_bkthomps"), OVER),
        (four("my_foo", "bkthomps", "bkthomps"), OVER),
        ([*four("my_foo", "bkthomps", "fake"), desc(("category", "account"))], OK),
        ([*four("my_foo", "bkthomps", "fake"), desc(("category", "account"))], OK),
        ([*four("my_foo", "bkthomps", "fake"), desc(("category", "account"))], OK),
    ]
    got = [(await front.ask("rl", *descriptors)).overall_code for descriptors, _ in steps]
    assert got == [code for _, code in steps]


async def test_trigger_shadow_mode_key_sh(front: Front) -> None:
    """trigger-shadow-mode-key.sh: a shadow_mode key over its limit never refuses."""
    await clear_of(60)
    got = [await front.ask("rl", desc(("foo", "pelle"), ("baz", "shady"))) for _ in range(5)]
    assert [r.overall_code for r in got] == [OK] * 5


async def test_upstream_metric_names_on_metrics(front: Front) -> None:
    """Upstream's statsd counters as Prometheus metrics on the node's ``/metrics``."""
    await front.ask("svc", desc(("limited", "metrics")))
    await front.ask("not-configured", desc(("a", "b")))
    metrics = await front.metrics()
    names = {name for name, _ in metrics}
    assert {
        "ratelimit_service_rate_limit_total_hits_total",
        "ratelimit_service_rate_limit_over_limit_total",
        "ratelimit_service_rate_limit_near_limit_total",
        "ratelimit_service_rate_limit_within_limit_total",
        "ratelimit_service_rate_limit_shadow_mode_total",
        "ratelimit_service_should_rate_limit_error_total",
        "ratelimit_service_config_load_success_total",
        "ratelimit_service_config_load_error_total",
        "ratelimit_service_global_shadow_mode_total",
        "ratelimit_service_total_requests_total",
        "ratelimit_service_rate_limit_domain_not_found_total",
    } <= names
    labels = (("domain", "svc"), ("key1", "limited_metrics"), ("key2", ""))
    assert metrics["ratelimit_service_rate_limit_total_hits_total", labels] >= 1
    assert (
        metrics[
            "ratelimit_service_rate_limit_domain_not_found_total", (("domain", "not-configured"),)
        ]
        >= 1
    )
