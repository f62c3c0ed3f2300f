"""The one registry of compiled twins: each optional extension, the pure-Python code that
does the same where it is absent, and whether this process loaded it.

Every module that has a compiled twin gets it through :func:`load`, once, at its own
import (nothing is looked up on a hot path). So the startup line can name what is
*loaded* (:func:`loaded`), not what files lie on disk.

Two switches, read from the environment:

- ``SMOCKRON_PURE_PYTHON=1``: every twin is left unloaded and the whole process runs the
  Python code (the tests compare both);
- ``SMOCKRON_REQUIRE_COMPILED=1``: a twin that is not built is an error, not a fallback:
  :func:`load` raises :class:`MissingCompiled`, and :func:`require` (which every daemon
  calls before it starts) names every missing one. ``scripts/test`` sets it, so a test run
  cannot pass on the Python path alone. ``SMOCKRON_PURE_PYTHON=1`` wins over it.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Final

import smockron
from smockron.errors import ConfigError

PURE_PYTHON_ENV: Final = "SMOCKRON_PURE_PYTHON"
REQUIRE_ENV: Final = "SMOCKRON_REQUIRE_COMPILED"


@dataclass(frozen=True)
class Twin:
    name: str
    """The short name the startup line uses (``_zmqfast``)."""
    module: str
    """The compiled module (``smockron.wire._zmqfast``)."""
    python: str
    """What runs instead where it is absent."""
    needs: str
    """What building it takes (Debian packages)."""


REGISTRY: Final = (
    Twin(
        "_zmqfast",
        "smockron.wire._zmqfast",
        "the Python loops of smockron/wire/batchio.py, accounting.py and control.py",
        "gcc, python3-dev",
    ),
    Twin(
        "_tablefast",
        "smockron.gatekeeper._tablefast",
        "the gatekeeper's Python update_run and passed",
        "gcc, python3-dev",
    ),
    Twin(
        "_localfast",
        "smockron.cluster._localfast",
        "smockron/core/algorithms.py for every cluster check",
        "gcc, python3-dev",
    ),
    Twin(
        "_native",
        "smockron.cluster._native",
        "the cluster's grpcio server (--grpc-server threads)",
        "g++, pkg-config, libgrpc++-dev, python3-dev",
    ),
    Twin(
        "_nativeclient",
        "smockron.cluster._nativeclient",
        "grpcio channels in the cluster's Python client",
        "g++, pkg-config, libgrpc++-dev, python3-dev",
    ),
)
BY_NAME: Final = {twin.name: twin for twin in REGISTRY}

_loaded: dict[str, bool] = {}
"""What :func:`load` resolved in this process: short name -> loaded."""


class MissingCompiled(ConfigError):
    """``SMOCKRON_REQUIRE_COMPILED=1`` and a compiled twin is not built."""


def pure_python() -> bool:
    return os.environ.get(PURE_PYTHON_ENV) == "1"


def required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1" and not pure_python()


def _import(twin: Twin) -> ModuleType | None:
    if pure_python():
        return None
    try:
        return importlib.import_module(twin.module)
    except ImportError:
        return None


def _missing_message(names: list[str]) -> str:
    needs = sorted({p.strip() for n in names for p in BY_NAME[n].needs.split(",")})
    several = len(names) > 1
    return (
        f"compiled extension{'s' if several else ''} {', '.join(names)} not built, and "
        f"{REQUIRE_ENV}=1 requires {'them' if several else 'it'}: install "
        f"{', '.join(needs)} (Debian packages) and reinstall smockron (pip install "
        f"--force-reinstall --no-deps .), or unset {REQUIRE_ENV} to run the Python code "
        "instead"
    )


def load(name: str) -> ModuleType | None:
    """The compiled twin ``name`` (a short name of :data:`REGISTRY`), or None where it is
    not built or ``SMOCKRON_PURE_PYTHON=1``. Raises :class:`MissingCompiled` where it is
    not built and ``SMOCKRON_REQUIRE_COMPILED=1``. Call it once, at import."""
    twin = BY_NAME[name]
    module = _import(twin)
    if module is None and required():
        raise MissingCompiled(_missing_message([name]))
    _loaded[name] = module is not None
    return module


def mark_unusable(name: str) -> None:
    """The module imported but cannot be used here (a stale build, a libzmq it cannot
    bind): the Python twin runs, and the startup line must not name it."""
    if required():
        raise MissingCompiled(
            f"compiled extension {name} is built but unusable (a stale "
            f"build?): reinstall smockron, or unset {REQUIRE_ENV}"
        )
    _loaded[name] = False


def loaded() -> list[str]:
    """The short names of the twins this process loaded, in registry order."""
    return [twin.name for twin in REGISTRY if _loaded.get(twin.name)]


def _built(twin: Twin) -> bool:
    """Whether the module's file is there, found without importing its package (which
    would load what this process does not use: the cluster's gRPC into a master)."""
    if twin.module in sys.modules:  # None there: its import is blocked
        return sys.modules[twin.module] is not None
    package, _, leaf = twin.module.rpartition(".")
    where = [os.path.join(base, *package.split(".")[1:]) for base in smockron.__path__]
    return importlib.machinery.PathFinder.find_spec(leaf, where) is not None


def missing() -> list[str]:
    """The twins that are not built; none when ``SMOCKRON_PURE_PYTHON=1`` (nothing is
    wanted then). A twin this process loaded is built; one it did not load is looked for
    on disk, not imported."""
    if pure_python():
        return []
    return [t.name for t in REGISTRY if not _loaded.get(t.name) and not _built(t)]


def require() -> None:
    """Under ``SMOCKRON_REQUIRE_COMPILED=1``: raise :class:`MissingCompiled` naming every
    twin that is not built (a daemon then refuses to start, exit 2)."""
    if required():
        absent = missing()
        if absent:
            raise MissingCompiled(_missing_message(absent))


def optional_extension(module: str) -> ModuleType | None:
    """:func:`load` by the compiled module's full name (``smockron.wire._zmqfast``)."""
    return load(module.rsplit(".", 1)[-1])
