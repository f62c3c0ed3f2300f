"""The committed pb modules are what the committed .proto files generate.

Compared on what the .proto files decide (the serialized descriptors, the stubs, the
type stubs), not on the tool versions stamped into the files, so a newer grpcio-tools
does not fail this test while an edited .proto without regeneration does.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from tests.support import REPO_ROOT

PROTO_DIR = REPO_ROOT / "smockron" / "cluster" / "proto"
PB_DIR = REPO_ROOT / "smockron" / "cluster" / "pb"
_DESCRIPTOR = re.compile(r"AddSerializedFile\((b'.*?')\)")


def essence(path: Path) -> str:
    text = path.read_text()
    if path.name.endswith("_pb2.py"):
        found = _DESCRIPTOR.search(text)
        assert found is not None, f"{path.name} has no serialized descriptor"
        return found.group(1)
    return "\n".join(line for line in text.splitlines() if "version" not in line.lower())


def test_generated_modules_are_up_to_date(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("regenerate", PROTO_DIR / "regenerate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(tmp_path) == 0
    generated = {p.name: essence(p) for p in tmp_path.iterdir()}
    committed = {p.name: essence(p) for p in PB_DIR.iterdir() if p.is_file()}
    assert set(generated) == set(committed)
    stale = [name for name in generated if generated[name] != committed[name]]
    assert stale == [], f"run python smockron/cluster/proto/regenerate.py; stale: {stale}"
