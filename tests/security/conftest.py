"""Key pairs for the security tests, written by ``smockron.curve.keygen`` (as the CLI)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from smockron.curve import CurveClient, CurveServer, curve_client, curve_server, keygen


@dataclass(frozen=True)
class Keys:
    """A master, a gatekeeper it allows (its public key in ``clients``), and a rogue
    gatekeeper and a rogue master whose keys nobody trusts."""

    dir: Path
    clients: Path

    def secret(self, name: str) -> Path:
        return self.dir / f"{name}.key_secret"

    def public(self, name: str) -> Path:
        return self.dir / f"{name}.key"

    def server(self, name: str = "master") -> CurveServer:
        found = curve_server(self.secret(name), self.clients)
        assert found is not None
        return found

    def client(self, name: str, master: str = "master") -> CurveClient:
        """``name``'s keys, pinning ``master``'s public key."""
        found = curve_client(self.secret(name), self.public(master))
        assert found is not None
        return found


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    folder, clients = tmp_path / "keys", tmp_path / "clients"
    for name in ("master", "gk", "rogue", "rogue-master"):
        keygen(folder, name)
    clients.mkdir()
    shutil.copy(folder / "gk.key", clients / "gk.key")
    return Keys(folder, clients)
