"""``smockron keygen`` and the key loaders: zmq.auth's file format, a private secret."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import zmq.auth
from click.testing import CliRunner

from smockron.cli import main
from smockron.curve import (
    curve_client,
    curve_server,
    keygen,
    load_allowed,
    load_keypair,
    load_public,
)
from smockron.errors import ConfigError


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_keygen_command_writes_a_pair_zmq_auth_reads(tmp_path: Path) -> None:
    folder = tmp_path / "new"
    result = CliRunner().invoke(main, ["keygen", str(folder), "gk1"])
    assert result.exit_code == 0, result.output
    public, secret = folder / "gk1.key", folder / "gk1.key_secret"
    assert f"public key: {public}" in result.output
    pub_only, none = zmq.auth.load_certificate(public)
    pub_again, sec = zmq.auth.load_certificate(secret)
    assert none is None and sec is not None
    assert pub_only == pub_again and len(pub_only) == 40 and len(sec) == 40
    assert zmq.curve_public(sec) == pub_only  # the secret key is the public key's pair
    assert mode(secret) == 0o600
    assert mode(public) == 0o644
    assert mode(folder) == 0o700


def test_keygen_never_overwrites_a_key(tmp_path: Path) -> None:
    _public, secret = keygen(tmp_path, "master")
    before = secret.read_bytes()
    result = CliRunner().invoke(main, ["keygen", str(tmp_path), "master"])
    assert result.exit_code == 1
    assert "exists" in result.output
    assert secret.read_bytes() == before
    with pytest.raises(ConfigError, match="bad key name"):
        keygen(tmp_path, "../escape")


def test_loaders_name_what_is_wrong(tmp_path: Path) -> None:
    public, secret = keygen(tmp_path / "k", "gk")
    assert load_keypair(secret).public == load_public(public)
    with pytest.raises(ConfigError, match="holds no secret key"):
        load_keypair(public)
    missing = tmp_path / "missing.key"
    with pytest.raises(ConfigError, match=f"key file '{missing}' does not exist"):
        load_public(missing)
    with pytest.raises(ConfigError, match="does not exist"):
        load_keypair(tmp_path / "missing.key_secret")
    with pytest.raises(ConfigError, match="not a directory"):
        load_allowed(tmp_path / "nowhere")
    assert load_allowed(tmp_path / "k") == {load_public(public)}  # .key_secret not listed
    with pytest.raises(ConfigError, match="both --curve-secret"):
        curve_server(secret, None)
    with pytest.raises(ConfigError, match="both --curve-secret"):
        curve_client(None, public)
    assert curve_server(None, None) is None and curve_client(None, None) is None


def test_a_secret_readable_by_others_is_loaded_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _public, secret = keygen(tmp_path, "gk")
    load_keypair(secret)
    assert "readable by other users" not in caplog.text
    secret.chmod(0o644)
    load_keypair(secret)
    assert "readable by other users" in caplog.text
