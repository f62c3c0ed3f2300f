"""Backends by scheme: every indexed scheme resolves to a class that declares it, and
a class cannot declare a scheme the index sends elsewhere."""

from __future__ import annotations

import pytest

from smockron.cluster.discovery.base import DISCOVERY
from smockron.errors import ConfigError
from smockron.master.stores import MemoryStore, open_store
from smockron.master.stores.uri import STORES
from smockron.registry import Registry


@pytest.mark.parametrize("registry", [STORES, DISCOVERY], ids=["stores", "discovery"])
def test_every_indexed_scheme_resolves_to_a_class_declaring_it(registry: Registry[object]) -> None:
    for scheme, module in registry.modules.items():
        cls = registry.lookup(scheme)
        assert scheme in vars(cls)["schemes"] and cls.__module__ == module


def test_a_class_declaring_a_scheme_indexed_elsewhere_is_refused() -> None:
    registry: Registry[object] = Registry("thing", {"a": "elsewhere"})
    with pytest.raises(TypeError, match=r"'a'.*'elsewhere'"):

        @registry.register
        class A:
            schemes = ("a",)


def test_an_inherited_declaration_registers_nothing() -> None:
    registry: Registry[object] = Registry("thing", {"a": __name__})

    @registry.register
    class A:
        schemes = ("a",)

    with pytest.raises(TypeError, match="declares no schemes"):

        @registry.register
        class B(A):
            pass

    assert registry.lookup("a") is A


def test_unknown_scheme_names_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"unknown peer discovery 'zk'; choices are dns, etcd"):
        DISCOVERY.lookup("zk")


def test_open_store_goes_through_the_registry() -> None:
    assert STORES.lookup("memory") is MemoryStore
    assert isinstance(open_store("memory://"), MemoryStore)
