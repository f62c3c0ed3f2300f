"""The click commands: bad flags fail fast with a message that names the problem."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from smockron.master.cli import master, router
from tests.support import free_port


def test_master_rejects_bad_rule() -> None:
    result = CliRunner().invoke(master, ["--rule", "api:10/fortnight:5"])
    assert result.exit_code == 2  # every bad value is a usage error
    assert "unknown time unit 'fortnight'" in result.output


def test_master_rejects_bad_store_and_config(tmp_path: Path) -> None:
    result = CliRunner().invoke(master, ["--store", "mongo://x"])
    assert result.exit_code == 2 and "unknown store scheme 'mongo'" in result.output
    bad = tmp_path / "bad.toml"
    bad.write_text("hwm = 0\n")
    result = CliRunner().invoke(master, ["--config", str(bad)])
    assert result.exit_code == 2 and "hwm must be an integer >= 1" in result.output


def test_master_cannot_bind_twice(tmp_path: Path) -> None:
    import zmq

    port = free_port()
    ctx = zmq.Context()
    taken = ctx.socket(zmq.SUB)
    taken.bind(f"tcp://127.0.0.1:{port}")
    try:
        result = CliRunner().invoke(
            master,
            [
                "--accounting",
                f"tcp://127.0.0.1:{port}",
                "--control",
                f"tcp://127.0.0.1:{free_port()}",
                "--stats-interval",
                "0",
            ],
        )
        assert result.exit_code == 1
        assert "cannot bind" in result.output
    finally:
        taken.close()
        ctx.term()


def test_router_needs_masters() -> None:
    result = CliRunner().invoke(router, ["--master", "tcp://a:1"])
    assert result.exit_code == 2 and "ACC_ADDR,CTL_ADDR" in result.output
