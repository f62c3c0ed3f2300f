"""Build hook for the optional C/C++ extensions.

Everything else is in pyproject.toml. Every extension is optional: when one cannot be
built, installation goes on without it.

- ``smockron.wire._zmqfast``: batch ZeroMQ receive and send (the master's receive loop,
  the gatekeepers' accounting); without it the pure-Python loops in
  smockron/wire/batchio.py and smockron/wire/accounting.py are used, which behave the same.
- ``smockron.cluster._native``: the cluster's native gRPC transport (libgrpc++ generic
  server, smockron/cluster/_native.cc), built only when ``pkg-config --exists grpc++``
  succeeds; without it ``--grpc-server native`` falls back to ``threads``.
- ``smockron.cluster._nativeclient``: the Python client's native channel (libgrpc++
  unary calls on bytes, smockron/cluster/_nativeclient.cc), built under the same
  condition; without it the client calls through grpcio, with the same results.
- ``smockron.gatekeeper._tablefast``: a gatekeeper's DELAY_UNTILs applied and its tables
  swept (smockron/gatekeeper/_tablefast.c); without it smockron/gatekeeper/_table.py's
  twins do the same in Python.
- ``smockron.cluster._localfast``: LocalLimiter.check's common cases
  (smockron/cluster/_localfast.c); without it every check runs core/algorithms.py,
  with the same results.
"""

import shutil
import subprocess

from setuptools import Extension, setup


def pkg_config(*args: str) -> list[str] | None:
    if shutil.which("pkg-config") is None:
        return None
    try:
        out = subprocess.run(
            ["pkg-config", *args], check=True, capture_output=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.split()


def native_extension() -> list[Extension]:
    if pkg_config("--exists", "grpc++") is None:
        return []
    cflags = pkg_config("--cflags", "grpc++") or []
    libs = pkg_config("--libs", "grpc++") or []
    return [
        Extension(
            name,
            [source],
            language="c++",
            extra_compile_args=["-std=c++17", "-O2", *cflags],
            extra_link_args=libs,
            depends=["smockron/cluster/_grpc_options.h"],
            optional=True,
        )
        for name, source in (
            ("smockron.cluster._native", "smockron/cluster/_native.cc"),
            ("smockron.cluster._nativeclient", "smockron/cluster/_nativeclient.cc"),
        )
    ]


setup(
    ext_modules=[
        Extension(
            "smockron.wire._zmqfast",
            ["smockron/wire/_zmqfast.c"],
            libraries=["dl"],
            optional=True,
        ),
        Extension(
            "smockron.gatekeeper._tablefast",
            ["smockron/gatekeeper/_tablefast.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "smockron.cluster._localfast",
            ["smockron/cluster/_localfast.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        *native_extension(),
    ]
)
