"""Build hook for the one optional C extension: the master's receive loop.

Everything else is in pyproject.toml. The extension is optional: when it cannot be
built (no compiler, not Linux), installation goes on and the master uses its
pure-Python receive loop (smockron/master/receive.py), which behaves the same.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "smockron.master._fastrecv",
            ["smockron/master/_fastrecv.c"],
            libraries=["dl"],
            optional=True,
        )
    ]
)
