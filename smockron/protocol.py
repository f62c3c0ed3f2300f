"""Moved to :mod:`smockron.wire.codec`; this name is kept for code written against it."""

from smockron.wire.codec import *  # noqa: F403
from smockron.wire.codec import __all__ as __all__
