"""``python -m smockron master`` as a subprocess, with real ZeroMQ and HTTP."""

from __future__ import annotations

import signal
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pytest

from smockron.wire.codec import ACCEPTED, DELAYED, REJECTED, encode_accounting
from tests import support
from tests.master.client import FakeGatekeeper, now_ms
from tests.support import RedisServer, free_ports, smockron_proc, wait_for, wait_port


def master_args(
    acc: int, ctl: int, *extra: str, rules: Sequence[str] = (), metrics: int = 0
) -> list[str]:
    return support.master_args(
        acc, ctl, "--stats-interval", "0.3", *extra, rules=rules, metrics=metrics
    )


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


@pytest.mark.parametrize("loop", ["compiled", "python"])
def test_throttles_logs_garbage_and_serves_metrics(
    tmp_path: Path, loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if loop == "python":
        monkeypatch.setenv("SMOCKRON_PURE_PYTHON", "1")
    acc, ctl, met = free_ports(3)
    args = master_args(acc, ctl, rules=["api:1/s:3", "probe:1/s:1"], metrics=met)
    with smockron_proc(args, tmp_path / "master.log") as proc, FakeGatekeeper(acc, ctl) as gk:
        gk.handshake()
        t = now_ms() + 1500  # ahead of the master's clock (within tolerance): exact results
        garbage = [
            [b"\xff" * 10],
            [b"api\0", b"ACCEPTED", b"x", b"12ab", b""],
            [b"api\0", b"NOPE", b"x", b"1", b""],
            [b"api", b"ACCEPTED", b"x", b"1", b""],
            [b"api\0"] * 9,
        ]
        for i in range(20):
            for _ in range(3):
                gk.accepted("api", b"user-%d" % i, t)
                gk.send(garbage[i % len(garbage)])
        gk.send(encode_accounting("api", DELAYED, b"user-0", t, t + 1000))
        for _ in range(5):  # counted, never recorded: no DELAY_UNTIL for user-r
            gk.send(encode_accounting("api", REJECTED, b"user-r", t))
        gk.accepted("nobody", b"user-0", t)  # a domain without rules
        got = gk.expect_control(21)
        assert sorted((c.identifier, c.until_ms) for c in got) == sorted(
            [(b"user-%d" % i, t + 1000) for i in range(20)] + [(b"user-0", t + 2000)]
        )
        assert all(c.domain == b"api" for c in got)
        wait_port(met)
        wait_for(
            lambda: (
                scrape(met).get('smockron_master_messages_total{domain="api",status="accepted"}')
                == 60
            )
        )
        m = scrape(met)
        assert m['smockron_master_messages_total{domain="api",status="delayed"}'] == 1
        assert m['smockron_master_messages_total{domain="api",status="rejected"}'] == 5
        assert gk.drain_control(0.3) == []  # nothing more, for user-r above all
        assert m['smockron_master_delay_until_published_total{domain="api"}'] == 21
        assert m['smockron_master_malformed_domain_total{domain="api"}'] == 36
        assert m['smockron_master_malformed_total{reason="bad_timestamp"}'] == 12
        assert m['smockron_master_malformed_total{reason="bad_status"}'] == 12
        assert m['smockron_master_malformed_total{reason="domain_nul"}'] == 12
        assert m['smockron_master_malformed_total{reason="frame_count"}'] == 24
        assert m["smockron_master_unknown_domain_total"] == 1
        assert m['smockron_master_dropped_total{domain="api"}'] == 0
        wait_for(lambda: "stats accepted=" in proc.log())
        assert "malformed accounting message" in proc.log()
        # 60 malformed messages, but the log is rate-limited to 10 lines per 10 s
        assert proc.log().count("malformed accounting message") == 10
        assert proc.stop(signal.SIGTERM) == 0
        assert "stopped accepted=" in proc.log()


@pytest.mark.parametrize("loop", ["compiled", "python"])
def test_decoder_limits_from_flags(
    tmp_path: Path, loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if loop == "python":
        monkeypatch.setenv("SMOCKRON_PURE_PYTHON", "1")
    acc, ctl, met = free_ports(3)
    limits = ["--max-identifier", "12", "--max-loginfo", "4"]
    args = master_args(acc, ctl, *limits, rules=["api:1/s:1", "probe:1/s:1"], metrics=met)
    with smockron_proc(args, tmp_path / "master.log") as proc, FakeGatekeeper(acc, ctl) as gk:
        gk.handshake()
        t = now_ms() + 1500
        gk.accepted("api", b"x" * 13, t)  # one byte too long
        gk.send(encode_accounting("api", ACCEPTED, b"with-log", t, loginfo=b"12345"))
        gk.accepted("api", b"x" * 12, t)
        gk.send(encode_accounting("api", ACCEPTED, b"with-log", t, loginfo=b"1234"))
        got = gk.expect_control(2)
        assert sorted((c.identifier, c.until_ms) for c in got) == [
            (b"with-log", t + 1000),
            (b"x" * 12, t + 1000),
        ]
        wait_port(met)
        wait_for(
            lambda: scrape(met).get('smockron_master_malformed_total{reason="oversized"}') == 2
        )
        assert proc.stop(signal.SIGTERM) == 0


def test_sighup_reloads_rules_without_losing_messages(tmp_path: Path) -> None:
    acc, ctl, met = free_ports(3)
    config = tmp_path / "smockron.toml"
    config.write_text('rules = ["api:1/s:100", "probe:1/s:1"]\n')
    args = master_args(acc, ctl, "--config", str(config), metrics=met)
    with smockron_proc(args, tmp_path / "master.log") as proc, FakeGatekeeper(acc, ctl) as gk:
        gk.handshake()
        t = now_ms()
        for _ in range(3):
            gk.accepted("api", b"a", t)
        assert gk.expect_control(1, timeout=1.0) == []
        config.write_text(
            'rules = ["probe:1/s:1"]\n[domains.api]\nrules = ["1/m:3"]\nalgorithm = "gcra"\n'
        )
        sent = 3
        for i in range(2000):  # traffic goes on while the master reloads
            if i == 500:
                proc.popen.send_signal(signal.SIGHUP)
            gk.accepted("api", b"bulk-%d" % (i % 700), t)
            sent += 1
        wait_for(lambda: "reloaded: 2 domain(s)" in proc.log())
        key = 'smockron_master_messages_total{domain="api",status="accepted"}'
        wait_port(met)
        wait_for(lambda: scrape(met).get(key) == sent)
        gk.drain_control()
        ts = now_ms() + 1500  # ahead of the master's clock, so GCRA's t is exactly ts
        for _ in range(4):  # GCRA 1/m, burst 3: V = ts-120000, ts-60000, ts, ts+60000
            gk.accepted("api", b"fresh", ts)
        got = gk.expect_control(2)
        assert [(c.identifier, c.until_ms) for c in got] == [
            (b"fresh", ts),
            (b"fresh", ts + 60_000),
        ]
        config.write_text("rules = [")  # a broken file keeps the current rules
        proc.popen.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload failed" in proc.log())
        assert proc.alive()


def test_redis_master_killed_and_replaced_keeps_enforcing(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    acc, ctl = free_ports(2)
    args = master_args(acc, ctl, "--store", redis_server.url, rules=["api:1/s:5", "probe:1/s:1"])
    with smockron_proc(args, tmp_path / "m1.log") as proc, FakeGatekeeper(acc, ctl) as gk:
        gk.handshake()
        t = now_ms()
        for i in range(300):  # traffic from others while it dies
            gk.accepted("api", b"other-%d" % i, t)
        for _ in range(4):
            gk.accepted("api", b"victim", t)
        wait_for(lambda: "victim" in _redis_keys(redis_server))
        proc.kill()
    with smockron_proc(args, tmp_path / "m2.log"), FakeGatekeeper(acc, ctl) as gk:
        gk.handshake()
        ts = now_ms() + 1500  # ahead of the master's clock, within the skew tolerance
        gk.accepted("api", b"victim", ts)
        got = gk.expect_control(1)
        # the four requests before the restart count: 5 in the window, so throttled
        assert [(c.identifier, c.until_ms) for c in got] == [(b"victim", ts + 1000)]


def _redis_keys(server: RedisServer) -> str:
    import redis

    client = redis.Redis.from_url(server.url)
    try:
        return str(client.keys("*"))
    finally:
        client.close()


def test_state_is_in_redis_after_a_clean_exit(tmp_path: Path, redis_server: RedisServer) -> None:
    acc, ctl = free_ports(2)
    args = master_args(acc, ctl, "--store", redis_server.url, rules=["api:1/m:5", "probe:1/s:1"])
    with smockron_proc(args, tmp_path / "m.log") as proc, FakeGatekeeper(acc, ctl) as gk:
        gk.handshake()
        gk.accepted("api", b"last-words")
        wait_for(lambda: "accepted=1" in proc.log() and "api.accepted=1" in proc.log())
        assert proc.stop(signal.SIGTERM) == 0
    assert "last-words" in _redis_keys(redis_server)
