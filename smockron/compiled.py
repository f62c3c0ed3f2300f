"""The optional compiled twins of hot loops: loaded when built, each with a pure-Python
twin that tests compare it against.

``SMOCKRON_PURE_PYTHON=1`` makes every one of them absent, so the whole process runs
the Python twins (the tests run both ways)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def optional_extension(name: str) -> ModuleType | None:
    """The compiled module ``name``, or None where it is not built or Python is forced."""
    if os.environ.get("SMOCKRON_PURE_PYTHON") == "1":
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
