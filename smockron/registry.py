"""Backends chosen by name: one registry of each kind maps a scheme (``redis``, ``etcd``)
to the class that serves it, as the ``limits`` library's StorageRegistry does.

Each backend class declares the schemes it serves (``schemes = ("redis", "rediss")``)
and registers itself with ``@REGISTRY.register``. The registry also indexes which module
holds each scheme, so a lookup imports that module only: a node with a static peer list
never imports an etcd client, a master on ``memory://`` never imports redis. A class
that declares a scheme its module is not indexed for fails on import, so the index and
the declarations cannot drift apart unnoticed.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from smockron.errors import ConfigError

T = TypeVar("T")
C = TypeVar("C", bound=type[Any])


class Registry(Generic[T]):
    """Scheme -> backend class, the classes imported on first lookup."""

    def __init__(self, kind: str, modules: Mapping[str, str]) -> None:
        self.kind = kind
        """What the backends are, for error messages (``store``, ``peer discovery``)."""
        self.modules: Mapping[str, str] = dict(modules)
        """Scheme -> the module whose class serves it."""
        self._classes: dict[str, type[T]] = {}

    def register(self, cls: C) -> C:
        """Class decorator: ``cls`` serves the ``schemes`` it declares itself (not
        inherited: a subclass serves nothing unless it says so)."""
        schemes: tuple[str, ...] = vars(cls).get("schemes", ())
        if not schemes:
            raise TypeError(f"{cls.__qualname__} declares no schemes")
        for scheme in schemes:
            if self.modules.get(scheme) != cls.__module__:
                raise TypeError(
                    f"{cls.__qualname__} serves {scheme!r}, which the {self.kind} registry "
                    f"looks for in {self.modules.get(scheme)!r}, not {cls.__module__!r}"
                )
            self._classes[scheme] = cls
        return cls

    def lookup(self, scheme: str) -> type[T]:
        """The class serving ``scheme``, its module imported now if it was not (an
        ImportError, a backend's missing extra, reaches the caller to phrase)."""
        module = self.modules.get(scheme)
        if module is None:
            choices = ", ".join(sorted(self.modules))
            raise ConfigError(f"unknown {self.kind} {scheme!r}; choices are {choices}")
        if scheme not in self._classes:
            importlib.import_module(module)
        try:
            return self._classes[scheme]
        except KeyError:
            raise TypeError(f"{module} registers no {self.kind} for {scheme!r}") from None
