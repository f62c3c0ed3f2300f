from __future__ import annotations

from pathlib import Path

import pytest

from smockron.cluster.envoy.config import EnvoyConfig, Limit, load_config, parse_domain
from smockron.errors import ConfigError

MONGO = """
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 5
    shadow_mode: true
  - key: database
    rate_limit: {unit: minute, requests_per_unit: 50, name: any-db}
  - key: remote_address
    rate_limit:
      unlimited: true
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 7}
  - key: to_number
    descriptors:
      - key: from_number
        rate_limit: {unit: day, requests_per_unit: 10}
      - key: from_number
        value: "5551234"
        rate_limit: {unit: day, requests_per_unit: 1}
"""

OTHER = """
domain: edge
descriptors:
  - key: generic_key
    value: slowpath
    rate_limit: {unit: minute, requests_per_unit: 3}
"""


@pytest.fixture
def config(tmp_path: Path) -> EnvoyConfig:
    (tmp_path / "mongo.yaml").write_text(MONGO)
    (tmp_path / "edge.yml").write_text(OTHER)
    (tmp_path / "notes.txt").write_text("not a config")
    return load_config([tmp_path])


def test_several_files_and_domains(config: EnvoyConfig) -> None:
    assert sorted(config.domains) == ["edge", "mongo_cps"]
    assert config.find("edge", [("generic_key", "slowpath")]) == Limit(3, "minute")


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([("database", "users")], Limit(500, "second")),
        ([("database", "default")], Limit(5, "second", shadow_mode=True)),
        ([("database", "other")], Limit(50, "minute", "any-db")),
        ([("remote_address", "10.0.0.1")], Limit(0, "second", unlimited=True)),
        ([("path", "/api/users")], Limit(7, "hour")),
        ([("path", "/static/x")], None),
        ([("to_number", "1"), ("from_number", "2")], Limit(10, "day")),
        ([("to_number", "1"), ("from_number", "5551234")], Limit(1, "day")),
        ([("to_number", "1")], None),  # the parent node has no limit of its own
        ([("to_number", "1"), ("from_number", "2"), ("extra", "x")], None),
        ([("nope", "x")], None),
        ([], None),
    ],
)
def test_matching(
    config: EnvoyConfig, entries: list[tuple[str, str]], expected: Limit | None
) -> None:
    assert config.find("mongo_cps", entries) == expected


def test_single_path_or_directory(tmp_path: Path) -> None:
    (tmp_path / "edge.yml").write_text(OTHER)
    assert list(load_config(str(tmp_path / "edge.yml")).domains) == ["edge"]
    assert list(load_config(tmp_path).domains) == ["edge"]


def test_unknown_domain_has_no_limits(config: EnvoyConfig) -> None:
    assert config.find("nope", [("database", "users")]) is None


def test_window_per_unit() -> None:
    assert Limit(1, "second").window == (1000, False)
    assert Limit(1, "minute").window == (0, True)
    assert Limit(1, "day").window == (2, True)
    assert Limit(1, "year").window == (5, True)


D = "domain: d\ndescriptors: [{key: k, rate_limit: "


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("- a\n- b\n", "expected a mapping"),
        ("descriptors: []\n", "'domain' must be a non-empty string"),
        ("domain: d\nextra: 1\n", "unknown key"),
        ("domain: d\ndescriptors: {}\n", "'descriptors' must be a list"),
        ("domain: d\ndescriptors: [{value: x}]\n", "'key' must be a non-empty string"),
        ("domain: d\ndescriptors: [{key: k, colour: red}]\n", "unknown descriptor key"),
        (
            D + "{unit: fortnight, requests_per_unit: 1}}]",
            "invalid rate limit unit",
        ),
        (
            D + "{unit: second, requests_per_unit: -1}}]",
            "requests_per_unit",
        ),
        ("domain: d\ndescriptors: [{key: k, rate_limit: {unit: second}}]\n", "requests_per_unit"),
        (
            "domain: d\ndescriptors: [{key: k, rate_limit: {unlimited: true, unit: second}}]\n",
            "unlimited",
        ),
        (
            D + "{unit: second, requests_per_unit: 1, burst: 2}}]",
            "unknown rate_limit key",
        ),
        ("domain: d\ndescriptors: [{key: k, shadow_mode: maybe}]\n", "shadow_mode"),
        (
            "domain: d\ndescriptors: [{key: k, value: v}, {key: k, value: v}]\n",
            "duplicate descriptor",
        ),
    ],
)
def test_invalid_documents(tmp_path: Path, document: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(document)
    with pytest.raises(ConfigError, match=message) as info:
        load_config([path])
    assert "bad.yaml" in str(info.value)


def test_duplicate_domain_and_unreadable(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(OTHER)
    (tmp_path / "b.yaml").write_text(OTHER)
    with pytest.raises(ConfigError, match="duplicate domain 'edge'"):
        load_config([tmp_path])
    with pytest.raises(ConfigError, match="cannot read"):
        load_config([tmp_path / "missing.yaml"])
    (tmp_path / "c.yaml").write_text("domain: [unclosed\n")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config([tmp_path / "c.yaml"])


def test_parse_domain_numeric_value() -> None:
    domain, root = parse_domain(
        {
            "domain": "d",
            "descriptors": [
                {"key": "k", "value": 5, "rate_limit": {"unit": "second", "requests_per_unit": 1}}
            ],
        }
    )
    assert domain == "d" and EnvoyConfig({"d": root}).find("d", [("k", "5")]) == Limit(1, "second")


def test_binary_or_deeply_nested_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "bin.yaml").write_bytes(b"domain: \xff\xfe\x00junk")
    with pytest.raises(ConfigError, match=r"bin\.yaml: cannot read rate limit config"):
        load_config([tmp_path / "bin.yaml"])
    (tmp_path / "deep.yaml").write_text("domain: " + "[" * 5000 + "]" * 5000)
    with pytest.raises(ConfigError, match=r"deep\.yaml: cannot read rate limit config"):
        load_config([tmp_path / "deep.yaml"])
