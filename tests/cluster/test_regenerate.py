"""The committed pb modules are exactly what the committed .proto files generate."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tests.support import REPO_ROOT

PROTO_DIR = REPO_ROOT / "smockron" / "cluster" / "proto"
PB_DIR = REPO_ROOT / "smockron" / "cluster" / "pb"


def test_generated_modules_are_up_to_date(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("regenerate", PROTO_DIR / "regenerate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(tmp_path) == 0
    generated = {p.name: p.read_text() for p in tmp_path.iterdir()}
    committed = {p.name: p.read_text() for p in PB_DIR.iterdir() if p.is_file()}
    assert set(generated) == set(committed)
    stale = [name for name in generated if generated[name] != committed[name]]
    assert stale == [], f"run python smockron/cluster/proto/regenerate.py; stale: {stale}"
