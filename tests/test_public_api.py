"""The curated public API of each package: what ``__all__`` promises, nothing more or less.

A name missing from the table below was dropped by accident (users' imports break); a
name missing from ``__all__`` but public in the package is an accidental export. Change
the table and the package together, on purpose (httpx keeps its surface the same way).
"""

from __future__ import annotations

import importlib
import types
from typing import Any

import pytest

PUBLIC: dict[str, list[str]] = {
    "smockron": ["ConfigError", "ProtocolError", "RuleError", "SmockronError", "__version__"],
    "smockron.errors": [
        "Aborted",
        "ClientError",
        "ClientTimeout",
        "ClientUnavailable",
        "ConfigError",
        "InvalidParams",
        "ItemError",
        "LeaseLost",
        "MalformedEvent",
        "ProtocolError",
        "RuleError",
        "SmockronError",
    ],
    "smockron.core": [
        "ALGORITHMS",
        "Algorithm",
        "History",
        "Rule",
        "RefillBucket",
        "gcra_update",
        "next_allowed",
        "parse_rate",
        "parse_rule_spec",
        "record",
    ],
    "smockron.wire": [
        "ACCEPTED",
        "DEFAULT_LIMITS",
        "DELAYED",
        "DELAY_UNTIL",
        "REJECTED",
        "RULES",
        "RULES_TOPIC",
        "Accounting",
        "AccountingStatus",
        "Control",
        "Limits",
        "Record",
        "RulesOffer",
        "control_frames",
        "decode_accounting",
        "decode_control",
        "decode_rules",
        "drain",
        "drain_accounting",
        "encode_accounting",
        "encode_control",
        "encode_rules",
        "send_all",
        "split_accounting",
        "topic",
        "wait_readable",
    ],
    "smockron.master": ["DomainPolicy", "DomainStats", "Engine", "Master", "Stats"],
    "smockron.master.stores": [
        "MemoryStore",
        "Scope",
        "State",
        "Store",
        "StoreURI",
        "Table",
        "open_store",
        "parse_store_uri",
    ],
    "smockron.gatekeeper": [
        "AsyncGatekeeper",
        "ForwardedFor",
        "Gatekeeper",
        "GatekeeperOptions",
        "HttpGate",
        "RequestInfo",
        "SmockronMiddleware",
        "SmockronWSGIMiddleware",
        "Verdict",
        "header",
        "http_loginfo",
        "peer_address",
    ],
    "smockron.cluster": [
        "HOUR",
        "MAX_BATCH_SIZE",
        "MILLISECOND",
        "MINUTE",
        "NATIVE_AVAILABLE",
        "SECOND",
        "Algorithm",
        "AsyncClient",
        "Behavior",
        "Client",
        "ClientError",
        "ClientTimeout",
        "ClientUnavailable",
        "HealthCheck",
        "ItemError",
        "RateLimitRequest",
        "RateLimitResponse",
        "Status",
        "grpc_target",
    ],
    "smockron.cluster.discovery": [
        "MECHANISMS",
        "Discovery",
        "OnChange",
        "PeerInfo",
        "make_discovery",
        "options",
        "options_from_env",
    ],
    "smockron.cluster.envoy": [
        "ConfigReloader",
        "EnvoyConfig",
        "EnvoySettings",
        "EnvoyStats",
        "EnvoyStatsCollector",
        "Limit",
        "LimitStats",
        "Match",
        "RateLimitServicer",
        "add_to_server",
        "load_config",
        "parse_domain",
    ],
}


def _public_names(module: types.ModuleType) -> set[str]:
    """Names a user sees in the package that are smockron's own: not submodules, not
    ``__future__`` features, not helpers imported from the standard library."""
    names = set()
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        if type(value).__name__ == "_Feature":  # from __future__ import annotations
            continue
        origin = getattr(value, "__module__", None)
        if isinstance(origin, str) and not origin.startswith("smockron"):
            continue  # typing.Any, collections.abc.Mapping, ...
        names.add(name)
    return names


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_all_is_the_curated_list(package: str) -> None:
    module = importlib.import_module(package)
    exported: list[str] = module.__all__
    assert sorted(exported) == sorted(PUBLIC[package])
    assert len(set(exported)) == len(exported), "a name is listed twice"


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_every_listed_name_exists_and_nothing_else_is_public(package: str) -> None:
    module = importlib.import_module(package)
    namespace: dict[str, Any] = vars(module)
    assert [name for name in module.__all__ if name not in namespace] == []
    extra = _public_names(module) - set(module.__all__)
    assert extra == set(), f"{package} exposes names not in __all__: {sorted(extra)}"


@pytest.mark.parametrize(
    ("old", "new"),
    [("smockron.protocol", "smockron.wire.codec"), ("smockron.zmqio", "smockron.wire.batchio")],
)
def test_moved_modules_keep_their_old_names(old: str, new: str) -> None:
    """Code written against the old module paths keeps working, with the same objects."""
    moved, home = importlib.import_module(old), importlib.import_module(new)
    assert moved.__all__ == home.__all__
    assert all(getattr(moved, name) is getattr(home, name) for name in home.__all__)
