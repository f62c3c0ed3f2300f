"""Moved to :mod:`smockron.wire.batchio`; this name is kept for code written against it."""

from smockron.wire.batchio import *  # noqa: F403
from smockron.wire.batchio import __all__ as __all__
