from __future__ import annotations

import asyncio
import os
from pathlib import Path

from smockron.cluster.envoy import (
    ConfigReloader,
    EnvoyConfig,
    Limit,
    RateLimitServicer,
    load_config,
)
from smockron.cluster.local import LocalLimiter

V1 = (
    "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
)
V2 = (
    "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 7}\n"
)


def loaded(servicer: RateLimitServicer) -> EnvoyConfig:
    """The servicer's config (these tests always have one loaded)."""
    assert servicer.config is not None
    return servicer.config


def write(path: Path, text: str, mtime_ns: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_reload_on_change_and_keep_running_config_on_error(tmp_path: Path) -> None:
    path = tmp_path / "edge.yaml"
    write(path, V1, 1_000_000_000)
    servicer = RateLimitServicer(LocalLimiter(), load_config(tmp_path))
    reloader = ConfigReloader(servicer, tmp_path, interval=0.01)
    assert not reloader.check()  # nothing changed since the first load

    write(path, V2, 2_000_000_000)
    assert reloader.check()
    assert loaded(servicer).find("edge", [("k", "x")]) == Limit(7, "minute")

    write(path, "domain: edge\ndescriptors: [{key: k, colour: red}]\n", 3_000_000_000)
    assert not reloader.check()
    assert servicer.stats.config_errors == 1
    assert loaded(servicer).find("edge", [("k", "x")]) == Limit(7, "minute")

    # A new file in the directory counts as a change too.
    write(tmp_path / "other.yml", V1.replace("edge", "other"), 4_000_000_000)
    write(path, V1, 5_000_000_000)
    assert reloader.check()
    assert sorted(loaded(servicer).domains) == ["edge", "other"]


async def test_run_polls_until_cancelled(tmp_path: Path) -> None:
    path = tmp_path / "edge.yaml"
    write(path, V1, 1_000_000_000)
    servicer = RateLimitServicer(LocalLimiter(), load_config(path))
    reloader = ConfigReloader(servicer, str(path), interval=0.01)
    task = asyncio.create_task(reloader.run())
    try:
        write(path, V2, 2_000_000_000)
        for _ in range(200):
            if loaded(servicer).find("edge", [("k", "x")]) == Limit(7, "minute"):
                break
            await asyncio.sleep(0.01)
        assert loaded(servicer).find("edge", [("k", "x")]) == Limit(7, "minute")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_binary_file_dropped_in_keeps_running_config(tmp_path: Path) -> None:
    write(tmp_path / "edge.yaml", V1, 1_000_000_000)
    servicer = RateLimitServicer(LocalLimiter(), load_config(tmp_path))
    reloader = ConfigReloader(servicer, tmp_path, interval=0.01)
    (tmp_path / "zz.yaml").write_bytes(b"\xff\xfe\x00 not text")
    assert not reloader.check()  # no exception escapes: the polling task would die
    assert servicer.stats.config_errors == 1
    assert loaded(servicer).find("edge", [("k", "x")]) == Limit(1, "second")
