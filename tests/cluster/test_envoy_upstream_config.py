"""envoyproxy/ratelimit's ``test/config/config_test.go``, ported: each test carries the name of
the upstream test whose facts it checks, against smockron's loader and lookup.

Fixtures are upstream's own files (tests/cluster/envoy/upstream/, see its README). Upstream
builds some configs inline as Go structs; those are written here as the YAML they stand
for. Stats keys are upstream's ``Stats.Key``/``FullKey``; smockron exports the counters
under them (see test_envoy_upstream_service.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from smockron.cluster.envoy.config import EnvoyConfig, Match, load_config
from smockron.errors import ConfigError

UPSTREAM = Path(__file__).parent / "envoy" / "upstream"
FIXTURES = UPSTREAM / "test_config"

Entries = list[tuple[str, str]]


def fixture(*names: str, merge: bool = False) -> EnvoyConfig:
    return load_config([FIXTURES / name for name in names], merge_domains=merge)


def inline(tmp_path: Path, text: str) -> EnvoyConfig:
    path = tmp_path / "inline.yaml"
    path.write_text(text)
    return load_config(path, merge_domains=False)


def check(config: EnvoyConfig, domain: str, entries: Entries) -> Match:
    match = config.lookup(domain, entries)
    assert match is not None, entries
    return match


# -- TestBasicConfig ------------------------------------------------------------------------

BASIC = [
    # (entries, requests_per_unit, unit, stats key); None = no limit
    ([("key1", "something")], None),
    ([("key1", "value1")], None),
    ([("key2", "value2"), ("subkey", "subvalue")], None),
    ([("key5", "value5"), ("subkey5", "subvalue")], None),
    (
        [("key1", "value1"), ("subkey1", "something")],
        (5, "second", "test-domain.key1_value1.subkey1"),
    ),
    (
        [("key1", "value1"), ("subkey1", "subvalue1")],
        (10, "second", "test-domain.key1_value1.subkey1_subvalue1"),
    ),
    ([("key2", "something")], (20, "minute", "test-domain.key2")),
    ([("key2", "value2")], (30, "minute", "test-domain.key2_value2")),
    ([("key2", "value3")], None),
    ([("key3", "foo")], (1, "hour", "test-domain.key3")),
    ([("key4", "foo")], (1, "day", "test-domain.key4")),
    ([("key7", "unspecified_value")], (70, "minute", "test-domain.key7_unspecified_value")),
    ([("key7", "another_value")], (70, "minute", "test-domain.key7_another_value")),
]


@pytest.mark.parametrize(("entries", "expected"), BASIC)
def test_TestBasicConfig(entries: Entries, expected: tuple[int, str, str] | None) -> None:
    config = fixture("basic_config.yaml")
    assert config.domains
    assert config.lookup("foo_domain", []) is None
    assert config.lookup("test-domain", []) is None
    match = config.lookup("test-domain", entries)
    if expected is None:
        assert match is None
        return
    assert match is not None
    assert (match.limit.requests_per_unit, match.limit.unit, match.stats_key) == expected


def test_TestBasicConfig_names_and_unlimited() -> None:
    config = fixture("basic_config.yaml")
    assert check(config, "test-domain", [("key3", "foo")]).limit.name == ""
    assert check(config, "test-domain", [("key4", "foo")]).limit.name == "key4_rate_limit"
    key6 = check(config, "test-domain", [("key6", "foo")])
    assert key6.limit.unlimited and key6.stats_key == "test-domain.key6"


def test_TestDomainMerge() -> None:
    config = fixture("merge_domain_key1.yaml", "merge_domain_key2.yaml", merge=True)
    assert config.lookup("foo_domain", []) is None
    assert config.lookup("test-domain", []) is None
    assert check(config, "test-domain", [("key1", "value1")]).limit.requests_per_unit == 10
    assert check(config, "test-domain", [("key2", "value2")]).limit.requests_per_unit == 20


def test_TestDomainMerge_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """MERGE_DOMAIN_CONFIG is the variable that turns merging on when not given."""
    files = [FIXTURES / "merge_domain_key1.yaml", FIXTURES / "merge_domain_key2.yaml"]
    with pytest.raises(ConfigError, match="duplicate domain 'test-domain'"):
        load_config(files)
    monkeypatch.setenv("MERGE_DOMAIN_CONFIG", "true")
    assert check(load_config(files), "test-domain", [("key2", "value2")])


OVERRIDES = [
    # (entries, override, expected stats key)
    (
        [("key1", "value1"), ("subkey1", "something")],
        (10, "day"),
        "test-domain.key1_value1.subkey1_something",
    ),
    (
        [("key1", "value1"), ("subkey1", "something")],
        (42, "hour"),
        "test-domain.key1_value1.subkey1_something",
    ),
    (
        [("key1", "value1"), ("subkey1", "something_else")],
        (42, "hour"),
        "test-domain.key1_value1.subkey1_something_else",
    ),
]


@pytest.mark.parametrize(("entries", "override", "stats_key"), OVERRIDES)
def test_TestConfigLimitOverride(
    entries: Entries, override: tuple[int, str], stats_key: str
) -> None:
    config = fixture("basic_config.yaml")
    # No matching domain: the override does not apply either.
    assert config.lookup("foo_domain", [], override) is None
    match = config.lookup("test-domain", entries, override)
    assert match is not None
    assert (match.limit.requests_per_unit, match.limit.unit) == override
    assert not match.limit.shadow_mode and match.limit.name == ""
    assert match.stats_key == stats_key


# -- the configs upstream refuses -----------------------------------------------------------

REFUSED = [
    # (upstream test, files, merge, what the message must say)
    ("TestEmptyDomain", ["empty_domain.yaml"], False, r"empty_domain\.yaml: .*empty domain"),
    (
        "TestDuplicateDomain",
        ["basic_config.yaml", "duplicate_domain.yaml"],
        False,
        r"duplicate_domain\.yaml: duplicate domain 'test-domain' in config file",
    ),
    ("TestEmptyKey", ["empty_key.yaml"], False, r"empty_key\.yaml: .*descriptor has empty key"),
    (
        "TestDuplicateKey",
        ["duplicate_key.yaml"],
        False,
        r"duplicate_key\.yaml: .*duplicate descriptor composite key 'test-domain\.key1_value1'",
    ),
    (
        "TestDuplicateKeyDomainMerge",
        ["merge_domain_key1.yaml", "merge_domain_key1.yaml"],
        True,
        r"merge_domain_key1\.yaml: .*duplicate descriptor composite key 'test-domain\.key1_value1'",
    ),
    ("TestBadLimitUnit", ["bad_limit_unit.yaml"], False, r"invalid rate limit unit 'foo'"),
    (
        "TestReplacesSelf",
        ["replaces_self.yaml"],
        False,
        r"replaces_self\.yaml: .*replaces should not contain name of same descriptor",
    ),
    (
        "TestReplacesEmpty",
        ["replaces_empty.yaml"],
        False,
        r"replaces_empty\.yaml: .*should not have an empty replaces entry",
    ),
    ("TestBadYaml", ["bad_yaml.yaml"], False, r"bad_yaml\.yaml: cannot read rate limit config"),
    ("TestMisspelledKey", ["misspelled_key.yaml"], False, r"unknown descriptor key 'ratelimit'"),
    (
        "TestMisspelledKey",
        ["misspelled_key2.yaml"],
        False,
        r"unknown rate_limit key 'requestsperunit'",
    ),
    (
        "TestNonStringKey",
        ["non_string_key.yaml"],
        False,
        r"non_string_key\.yaml: config error, key is not of type string: 0\.25",
    ),
    (
        "TestNonMapList",
        ["non_map_list.yaml"],
        False,
        r"non_map_list\.yaml: config error, yaml file contains list of type other than map: a",
    ),
    (
        "TestUnlimitedWithRateLimitUnit",
        ["unlimited_with_unit.yaml"],
        False,
        r"unlimited_with_unit\.yaml: .*should not specify rate limit unit when unlimited",
    ),
]


@pytest.mark.parametrize(
    ("files", "merge", "message"),
    [pytest.param(files, merge, message, id=name) for name, files, merge, message in REFUSED],
)
def test_refused_configs(files: list[str], merge: bool, message: str) -> None:
    """TestEmptyDomain, TestDuplicateDomain, TestEmptyKey, TestDuplicateKey,
    TestDuplicateKeyDomainMerge, TestBadLimitUnit, TestReplacesSelf, TestReplacesEmpty,
    TestBadYaml, TestMisspelledKey, TestNonStringKey, TestNonMapList,
    TestUnlimitedWithRateLimitUnit: upstream panics with a config error; so do we, with
    the file's name and upstream's reason in the message."""
    with pytest.raises(ConfigError, match=message):
        fixture(*files, merge=merge)


# -- TestShadowModeConfig -------------------------------------------------------------------

SHADOW = [
    ([("key1", "value1"), ("subkey1", "something")], 5, "second", False),
    ([("key1", "value1"), ("subkey1", "subvalue1")], 10, "second", True),
    ([("key2", "something")], 20, "minute", True),
    ([("key2", "value2")], 30, "minute", False),
]


@pytest.mark.parametrize(("entries", "requests", "unit", "shadow"), SHADOW)
def test_TestShadowModeConfig(entries: Entries, requests: int, unit: str, shadow: bool) -> None:
    limit = check(fixture("shadowmode_config.yaml"), "test-domain", entries).limit
    assert (limit.requests_per_unit, limit.unit, limit.shadow_mode) == (requests, unit, shadow)


# -- TestWildcardConfig ---------------------------------------------------------------------

WILDCARD = [
    # (entries, stats key or None for no limit)
    ([("noVal", "foo1")], "test-domain.noVal"),
    ([("noVal", "foo2")], "test-domain.noVal"),
    ([("wild", "foo1")], "test-domain.wild_foo*"),
    ([("wild", "foo2")], "test-domain.wild_foo*"),
    ([("nestedWild", "val1"), ("wild", "goo2")], "test-domain.nestedWild_val1.wild_goo*"),
    ([("wild", "bar")], None),
    ([("noWild", "foo1")], None),  # a value without * matches only itself
    ([("midWild", "barab")], "test-domain.midWild_bar*b"),
    ([("midWild", "bar123b")], "test-domain.midWild_bar*b"),
    ([("midWild", "barb")], "test-domain.midWild_bar*b"),  # * matches the empty string
    ([("midWild", "bara")], None),  # no suffix b
    ([("midWild", "xbarb")], None),  # no prefix bar
    ([("multiWild", "foo123bar456baz")], "test-domain.multiWild_foo*bar*baz"),
    ([("multiWild", "foobarbaz")], "test-domain.multiWild_foo*bar*baz"),
    ([("multiWild", "foo123baz")], None),  # no bar
    ([("multiWild", "bar456baz")], None),  # no foo
]


@pytest.mark.parametrize(("entries", "stats_key"), WILDCARD)
def test_TestWildcardConfig(entries: Entries, stats_key: str | None) -> None:
    match = fixture("wildcard.yaml").lookup("test-domain", entries)
    assert (None if match is None else match.stats_key) == stats_key


# -- TestDetailedMetric ---------------------------------------------------------------------

REALISTIC = """
domain: nested
descriptors:
  - key: key_1
    rate_limit: {requests_per_unit: 500, unit: minute}
    detailed_metric: true
  - key: key_1
    value: some-value-for-key-1
    rate_limit: {requests_per_unit: 500, unit: minute}
  - key: key_2
    rate_limit: {requests_per_unit: 5000, unit: minute}
    detailed_metric: true
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        rate_limit: {requests_per_unit: 5, unit: minute}
        detailed_metric: true
  - key: key_2
    value: specific-id
    rate_limit: {requests_per_unit: 50000, unit: minute}
    detailed_metric: true
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        rate_limit: {requests_per_unit: 100, unit: minute}
        detailed_metric: true
"""

NESTED = """
domain: nested
descriptors:
  - key: key-1
    rate_limit: {{requests_per_unit: 100, unit: minute}}
    detailed_metric: {d1}
    descriptors:
      - key: key-2
        rate_limit: {{requests_per_unit: 5, unit: minute}}
        detailed_metric: {d2}
"""

DETAILED = [
    (NESTED.format(d1="true", d2="false"), [("key-1", "value-1")], "nested.key-1_value-1"),
    (NESTED.format(d1="false", d2="false"), [("key-1", "value-1")], "nested.key-1"),
    (
        NESTED.format(d1="true", d2="true"),
        [("key-1", "value-1"), ("key-2", "value-2")],
        "nested.key-1_value-1.key-2_value-2",
    ),
    (
        NESTED.format(d1="false", d2="false"),
        [("key-1", "value-1"), ("key-2", "value-2")],
        "nested.key-1.key-2",
    ),
    (REALISTIC, [("key_1", "value-for-key-1")], "nested.key_1_value-for-key-1"),
    (REALISTIC, [("key_2", "key-2-value")], "nested.key_2_key-2-value"),
    (
        REALISTIC,
        [("key_2", "key-2-value"), ("key_3", "requested-key3-value")],
        "nested.key_2_key-2-value.key_3_requested-key3-value",
    ),
]


@pytest.mark.parametrize(("text", "entries", "stats_key"), DETAILED)
def test_TestDetailedMetric(tmp_path: Path, text: str, entries: Entries, stats_key: str) -> None:
    assert check(inline(tmp_path, text), "nested", entries).stats_key == stats_key


# -- TestValueToMetric_* --------------------------------------------------------------------

ROUTE = """
domain: {domain}
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            detailed_metric: {detailed}
            rate_limit: {{requests_per_unit: 60, unit: minute}}
"""

K1K2 = """
domain: d
descriptors:
  - key: k1
    value_to_metric: {v1}
    descriptors:
      - key: k2
        rate_limit: {{requests_per_unit: 1, unit: second}}
"""

MID = """
domain: d
descriptors:
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit: {requests_per_unit: 1, unit: second}
"""

CONFIGURED = """
domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {requests_per_unit: 60, unit: minute}
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {requests_per_unit: 30, unit: minute}
"""

WILD_VTM = """
domain: domain
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {requests_per_unit: 100, unit: minute}
"""

R3 = [("route", "draw"), ("http_method", "GET"), ("subject_id", "123")]
ROUTE_PLAIN = ROUTE.format(domain="domain", detailed="false")
VALUE_TO_METRIC = [
    (
        "TestValueToMetric_UsesRuntimeValuesInStats",
        ROUTE_PLAIN,
        "domain",
        R3,
        "domain.route_draw.http_method_GET.subject_id",
    ),
    (
        "TestValueToMetric_DefaultKeyIncludesValueAtThatLevel",
        K1K2.format(v1="true"),
        "d",
        [("k1", "A"), ("k2", "foo")],
        "d.k1_A.k2",
    ),
    (
        "TestValueToMetric_MidLevelOnly",
        MID,
        "d",
        [("k1", "X"), ("k2", "Y"), ("k3", "Z")],
        "d.k1.k2_Y.k3",
    ),
    (
        "TestValueToMetric_NoFlag_Unchanged",
        K1K2.format(v1="false"),
        "d",
        [("k1", "X"), ("k2", "Y")],
        "d.k1.k2",
    ),
    (
        "TestValueToMetric_DoesNotOverrideDetailedMetric",
        ROUTE.format(domain="domain", detailed="true"),
        "domain",
        R3,
        "domain.route_draw.http_method_GET.subject_id_123",
    ),
    (
        "TestValueToMetric_WithConfiguredValues",
        CONFIGURED,
        "test-domain",
        [("route", "api"), ("http_method", "GET"), ("subject_id", "user123")],
        "test-domain.route_api.http_method_GET.subject_id",
    ),
    (
        "TestValueToMetric_WithConfiguredValues",
        CONFIGURED,
        "test-domain",
        [("route", "api"), ("http_method", "POST"), ("subject_id", "user456")],
        "test-domain.route_api.http_method_POST.subject_id",
    ),
    (
        "TestValueToMetric_WithWildcard",
        WILD_VTM,
        "domain",
        [("user", "alice"), ("action", "readfile"), ("resource", "documents")],
        "domain.user_alice.action_readfile.resource",
    ),
    (
        "TestValueToMetric_WithWildcard",
        WILD_VTM,
        "domain",
        [("user", "bob"), ("action", "readdata"), ("resource", "database")],
        "domain.user_bob.action_readdata.resource",
    ),
    (
        "TestValueToMetric_WithEmptyValue",
        ROUTE_PLAIN,
        "domain",
        [("route", ""), ("http_method", "GET"), ("subject_id", "123")],
        "domain.route.http_method_GET.subject_id",
    ),
    (
        "TestValueToMetric_WithEmptyValue",
        ROUTE_PLAIN,
        "domain",
        [("route", "draw"), ("http_method", ""), ("subject_id", "123")],
        "domain.route_draw.http_method.subject_id",
    ),
    (
        "TestValueToMetric_WithEmptyValue",
        ROUTE_PLAIN,
        "domain",
        [("route", ""), ("http_method", ""), ("subject_id", "123")],
        "domain.route.http_method.subject_id",
    ),
]


@pytest.mark.parametrize(
    ("text", "domain", "entries", "stats_key"),
    [pytest.param(*case[1:], id=case[0]) for case in VALUE_TO_METRIC],
)
def test_TestValueToMetric(
    tmp_path: Path, text: str, domain: str, entries: Entries, stats_key: str
) -> None:
    """TestValueToMetric_*: the stats key carries the request's values where
    ``value_to_metric`` asks for them (and ``detailed_metric`` wins)."""
    assert check(inline(tmp_path, text), domain, entries).stats_key == stats_key


# -- TestShareThreshold ---------------------------------------------------------------------

SHARE = [
    # (entries, requests_per_unit, share patterns, stats key)
    ([("files", "files/a.txt")], 100, ("files/*",), "test-domain.files_files/*"),
    ([("files", "files/b/c.txt")], 100, ("files/*",), "test-domain.files_files/*"),
    (
        [("route", "api/v1"), ("method", "GET")],
        60,
        ("api/*", ""),
        "test-domain.route_api/*.method",
    ),
    (
        [("service", "svc/user"), ("endpoint", "get")],
        80,
        ("svc/*", ""),
        "test-domain.service_svc/*.endpoint_get",
    ),
    (
        [("nested", "parent"), ("files", "nested/file1.txt")],
        200,
        ("", "nested/*"),
        "test-domain.nested_parent.files_nested/*",
    ),
    (
        [("files", "top/file1.txt"), ("files", "nested/file1.txt")],
        300,
        ("top/*", "nested/*"),
        "test-domain.files_top/*.files_nested/*",
    ),
    (
        [("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")],
        120,
        ("path/*", "", ""),
        "test-domain.path_path/*.file_file/*.type",
    ),
    (
        [("user", "user/alice"), ("resource", "res/file1"), ("action", "read")],
        150,
        ("user/*", "res/*", ""),
        "test-domain.user_user/*.resource_res/*.action",
    ),
    ([("file", "test1")], 50, (), "test-domain.file_test1"),  # the explicit value wins
    ([("file", "test2")], 100, ("test*",), "test-domain.file_test*"),
    ([("file", "testing")], 100, ("test*",), "test-domain.file_test*"),
    ([("midpath", "/api/v1")], 100, ("/api*v1",), "test-domain.midpath_/api*v1"),
    ([("midpath", "/api-beta-v1")], 100, ("/api*v1",), "test-domain.midpath_/api*v1"),
    ([("multiroute", "svcXepYrpc")], 50, ("svc*ep*rpc",), "test-domain.multiroute_svc*ep*rpc"),
    ([("midroute", "/api/v2")], 80, ("/api*v2",), "test-domain.midroute_/api*v2"),
    ([("midroute", "/api-beta-v2")], 80, ("/api*v2",), "test-domain.midroute_/api*v2"),
    (
        [("tenant", "t1prod"), ("resource", "resAv2")],
        60,
        ("t*prod", "res*v2"),
        "test-domain.tenant_t*prod.resource_res*v2",
    ),
    (
        [("tenant", "t99prod"), ("resource", "resBBBv2")],
        60,
        ("t*prod", "res*v2"),
        "test-domain.tenant_t*prod.resource_res*v2",
    ),
]


@pytest.mark.parametrize(("entries", "requests", "patterns", "stats_key"), SHARE)
def test_TestShareThreshold(
    entries: Entries, requests: int, patterns: tuple[str, ...], stats_key: str
) -> None:
    match = check(fixture("share_threshold.yaml"), "test-domain", entries)
    assert match.limit.requests_per_unit == requests
    assert match.share_patterns == patterns
    assert match.stats_key == stats_key


@pytest.mark.parametrize(
    "entries", [[("midpath", "/api/v2")], [("multiroute", "svcABCrpc")]], ids=str
)
def test_TestShareThreshold_no_match(entries: Entries) -> None:
    assert fixture("share_threshold.yaml").lookup("test-domain", entries) is None


def test_TestShareThreshold_needs_a_wildcard(tmp_path: Path) -> None:
    text = "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n"
    with pytest.raises(ConfigError, match="share_threshold can only be used with wildcard"):
        inline(tmp_path, text)


# -- TestWildcardStatsBehavior --------------------------------------------------------------

WILD = """
domain: test-domain
descriptors:
  - key: wild
    value: "{value}"
    value_to_metric: {vtm}
    share_threshold: {share}
    rate_limit: {{requests_per_unit: 20, unit: minute}}
"""

WILD_OTHER = """
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    descriptors:
      - key: other
        value_to_metric: true
        descriptors:
          - key: limit
            rate_limit: {requests_per_unit: 20, unit: minute}
"""


def wild(value: str, vtm: bool = False, share: bool = False) -> str:
    """WILD for ``value``, with value_to_metric and share_threshold as given."""
    return WILD.format(value=value, vtm=str(vtm).lower(), share=str(share).lower())


WILD_STATS = [
    (wild("foo*"), [("wild", "foo1")], "test-domain.wild_foo*"),
    (wild("foo*", vtm=True), [("wild", "foo1")], "test-domain.wild_foo1"),
    (wild("foo*", share=True), [("wild", "foo1")], "test-domain.wild_foo*"),
    (wild("foo*", vtm=True, share=True), [("wild", "foo1")], "test-domain.wild_foo*"),
    (
        WILD_OTHER,
        [("wild", "foo1"), ("other", "bar"), ("limit", "X")],
        "test-domain.wild_foo*.other_bar.limit",
    ),
    (wild("foo*bar*"), [("wild", "foo123bar456")], "test-domain.wild_foo*bar*"),
    (wild("foo*bar*"), [("wild", "fooXbarY")], "test-domain.wild_foo*bar*"),
    (wild("foo*bar*", vtm=True), [("wild", "foo123bar456")], "test-domain.wild_foo123bar456"),
]


@pytest.mark.parametrize(("text", "entries", "stats_key"), WILD_STATS)
def test_TestWildcardStatsBehavior(
    tmp_path: Path, text: str, entries: Entries, stats_key: str
) -> None:
    assert check(inline(tmp_path, text), "test-domain", entries).stats_key == stats_key


# -- TestMetadata ---------------------------------------------------------------------------


def test_TestMetadata() -> None:
    config = fixture("metadata.yaml")
    assert config.lookup("test-domain", []) is None
    sub = check(config, "test-domain", [("key1", "value1"), ("subkey1", "something")])
    assert (sub.limit.requests_per_unit, sub.limit.unit) == (5, "second")
    assert sub.stats_key == "test-domain.key1_value1.subkey1"
    assert sub.metadata == {"name": "service_1"}
    key2 = check(config, "test-domain", [("key2", "something")])
    assert (key2.limit.requests_per_unit, key2.limit.unit) == (20, "minute")
    assert key2.metadata == {"service_with_quota": {"name": "service_2"}}
    assert (
        check(config, "test-domain", [("key1", "value1"), ("subkey1", "subvalue1")]).metadata
        is None
    )


# -- upstream's example and integration-test files load unchanged ---------------------------


def test_examples_ratelimit_config_load_unchanged() -> None:
    config = load_config(UPSTREAM / "examples", merge_domains=False)
    assert sorted(config.domains) == ["mongo_cps", "rl"]
    account = check(config, "rl", [("category", "account")])
    assert account.limit.replaces == ("bkthomps", "fake_name")
    bkthomps = check(config, "rl", [("foo", "x"), ("bar", "bkthomps")])
    assert bkthomps.limit.name == "bkthomps"
    banned = check(config, "rl", [("foo", "x"), ("bar", "banned")]).limit
    assert (banned.name, banned.requests_per_unit) == ("banned_limit", 0)
    shady = check(config, "rl", [("foo", "x"), ("baz", "shady")]).limit
    assert shady.shadow_mode
    assert check(config, "rl", [("unspec", "v")]).stats_key == "rl.unspec_v"
    service = check(config, "rl", [("service", "service_1")])
    assert service.limit.quota_mode
    assert service.metadata == {"service_with_quota": {"name": "service_1"}}
    assert check(config, "rl", [("qux", "q")]).limit.unlimited
    users = check(config, "mongo_cps", [("database", "users")]).limit
    assert (users.requests_per_unit, users.unit) == (500, "second")


def test_integration_runtime_directory_loads_unchanged() -> None:
    runtime = UPSTREAM / "integration_runtime"
    config = load_config([runtime / "config", runtime / "reload.yaml"], merge_domains=False)
    assert sorted(config.domains) == ["another", "basic", "reload", "share-threshold-test"]
    assert check(config, "basic", [("one_per_minute", "x")]).limit.requests_per_unit == 1
    assert check(config, "reload", [("block", "x")]).limit.requests_per_unit == 0
    files = check(config, "share-threshold-test", [("files", "files/a")])
    assert files.share_patterns == ("files/*",)
    assert check(config, "another", [("key4", "x")]).limit.unit == "day"


def test_every_unit_name_including_week(tmp_path: Path) -> None:
    units = ["second", "minute", "hour", "day", "week", "month", "year", "WEEK", "Minute"]
    text = "domain: d\ndescriptors:\n" + "".join(
        f"  - key: k{i}\n    rate_limit: {{unit: {u}, requests_per_unit: 1}}\n"
        for i, u in enumerate(units)
    )
    config = inline(tmp_path, text)
    got = [check(config, "d", [(f"k{i}", "v")]).limit.unit for i in range(len(units))]
    assert got == ["second", "minute", "hour", "day", "week", "month", "year", "week", "minute"]
    with pytest.raises(ConfigError, match="invalid rate limit unit 'unknown'"):
        inline(
            tmp_path,
            "domain: d\ndescriptors: [{key: k, rate_limit: {unit: unknown, requests_per_unit: 1}}]",
        )


def test_known_keys_in_unexpected_places_are_ignored_as_upstream(tmp_path: Path) -> None:
    """Upstream checks key names against one list for every level: ``unit`` beside ``key``
    loads (and means nothing there), an unknown name anywhere does not."""
    config = inline(
        tmp_path,
        "domain: d\ndescriptors:\n  - key: k\n    unit: day\n    name: x\n"
        "    rate_limit: {unit: minute, requests_per_unit: 3, unlimited: false}\n",
    )
    assert check(config, "d", [("k", "v")]).limit.requests_per_unit == 3
