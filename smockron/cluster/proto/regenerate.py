"""Regenerate smockron/cluster/pb/ from the .proto files next to this script.

Run ``python smockron/cluster/proto/regenerate.py`` after editing a .proto file and commit
the result: the generated modules are committed so installs need no grpcio-tools.
protoc writes ``import gubernator_pb2`` for the cross-file import; we rewrite it into a
package import so the modules work as ``smockron.cluster.pb.*``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "pb"
PROTOS = ["gubernator.proto", "peers.proto"]


def main(out: Path = OUT) -> int:
    """Generate into ``out`` (the committed package by default; tests use a temp dir)."""
    from grpc_tools import protoc  # type: ignore[import-untyped]  # build-time only

    args = [
        "protoc",
        f"-I{HERE}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *(str(HERE / p) for p in PROTOS),
    ]
    if protoc.main(args) != 0:
        print("protoc failed", file=sys.stderr)
        return 1
    for path in out.glob("*_pb2*.py*"):
        text = path.read_text()
        fixed = re.sub(
            r"^import (\w+_pb2)\b", r"from smockron.cluster.pb import \1", text, flags=re.M
        )
        if fixed != text:
            path.write_text(fixed)
    (out / "__init__.py").write_text('"""Generated protobuf/gRPC modules; see ../proto/."""\n')
    return 0


if __name__ == "__main__":
    sys.exit(main())
