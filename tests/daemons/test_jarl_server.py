"""JARL over real TCP: the seed's Python client, the CLI, signals, the count log."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from pathlib import Path

import pytest

from smockron.daemons.jarl.algorithm import Jarl
from smockron.daemons.jarl.server import JarlServer
from tests.support import (
    Proc,
    free_port,
    run_smockron,
    smockron_proc,
    smockron_run,
    stopping,
    wait_for,
    wait_port,
)


def get_delay(port: int) -> float:
    """The seed's client, verbatim in spirit: connect, recv(7), float()."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(("127.0.0.1", port))
        data = s.recv(7)
        delay: float = float(data.decode())
        return delay


def read_all(port: int) -> bytes:
    """Everything the server sends before it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        chunks = []
        while chunk := s.recv(100):
            chunks.append(chunk)
        return b"".join(chunks)


def jarl_args(port: int | str, *options: str, service: str = "s") -> list[str]:
    """``smockron jarl`` for ``service`` on 127.0.0.1:``port``, with ``options``."""
    return ["jarl", "--service", service, *options, "--ip", "127.0.0.1", "--port", str(port)]


def limit(requests: str, period: str) -> tuple[str, ...]:
    return ("--requests", requests, "--period", period)


def test_seed_client_against_a_real_jarl_process(tmp_path: Path) -> None:
    port = free_port()
    args = jarl_args(port, *limit("3", "60"), service="SocialMedia")
    with smockron_proc(args, tmp_path / "jarl.log") as proc:
        wait_port(port)  # this probe is a connection too: it takes the first slot
        assert [get_delay(port) for _ in range(2)] == [0.0, 0.0]
        started = time.monotonic()
        over = get_delay(port)  # 4th arrival: base 20 * 1 + (60 - age of the 1st)
        assert 70.0 < over <= 80.0
        second = read_all(port)  # the server closes the connection after the answer
        elapsed = time.monotonic() - started
        assert 100.0 - elapsed - (80.0 - over) - 0.002 <= float(second) <= 100.0
        raw = read_all(port)
        assert raw.count(b".") == 1 and len(raw.split(b".")[1]) == 3 and b"\n" not in raw
        assert proc.stop(signal.SIGTERM) == 0
    assert "shutting down" in proc.log()
    assert "Traceback" not in proc.log()


def test_sigint_exits_cleanly(tmp_path: Path) -> None:
    port = free_port()
    with smockron_proc(jarl_args(port, *limit("1", "1")), tmp_path / "jarl.log") as proc:
        wait_port(port)
        assert proc.stop(signal.SIGINT) == 130  # Ctrl-C: graceful, then exit 130
    assert "interrupted" in proc.log() and "Traceback" not in proc.log()


@pytest.mark.parametrize(
    ("requests", "period", "message"),
    [
        ("0", "1", "--requests must be at least 1, got 0"),
        ("1", "0", "--period must be at least 1, got 0"),
        ("1", "-3", "--period must be at least 1, got -3"),
        ("1", "1.5", "'1.5' is not a valid integer"),
    ],
)
def test_cli_refuses_zero_or_fractional_limits_with_a_clear_message(
    requests: str, period: str, message: str
) -> None:
    out = smockron_run(jarl_args(1, *limit(requests, period)))
    assert out.returncode == 2
    assert message in out.stderr


def test_help_explains_the_answer() -> None:
    from click.testing import CliRunner

    from smockron.daemons.jarl.cli import jarl

    result = CliRunner().invoke(jarl, ["-h"])
    assert result.exit_code == 0
    for flag in ("--service", "--period", "--requests", "--ip", "--port", "three decimals"):
        assert flag in result.output


async def test_per_interval_count_log_and_client_garbage(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="smockron.jarl")
    clock_now = [100.0]
    server = JarlServer(Jarl(2, 10), "127.0.0.1", 0, clock=lambda: clock_now[0], log_every=0.05)
    await server.start()
    try:
        answers = []
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"garbage the server must ignore\n" * 10)
            answers.append(await reader.read())
            writer.close()
            await writer.wait_closed()
        assert answers == [b"0.000", b"0.000", b"15.000"]  # 5 * 1 + (10 - 0)
        await asyncio.sleep(0.12)
    finally:
        await server.stop()
    assert "answered=3 delayed=1" in caplog.text


def test_a_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = smockron_run(jarl_args(port, *limit("1", "1")))
    assert out.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr


async def test_many_concurrent_clients_share_one_queue_and_one_counter() -> None:
    """300 clients at once on a frozen clock: whoever comes first, the answers as a whole
    are exactly the original's: `requests` zeros, then period + base_delay x 1, 2, 3..."""
    server = JarlServer(Jarl(requests=50, period=10), "127.0.0.1", 0, clock=lambda: 7.0)
    await server.start()

    async def ask() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            return await reader.read()
        finally:
            writer.close()
            await writer.wait_closed()

    try:
        async with asyncio.timeout(20):
            answers = await asyncio.gather(*(ask() for _ in range(300)))
    finally:
        await server.stop()
    expected = [b"0.000"] * 50 + [b"%.3f" % (10 + 0.2 * k) for k in range(1, 251)]
    assert sorted(answers, key=float) == expected
    assert (server.stats.answered, server.stats.delayed) == (300, 250)
    assert server.jarl.counter == 250


async def test_clients_that_reset_before_the_answer_do_not_stop_the_server() -> None:
    import struct

    server = JarlServer(Jarl(requests=1000, period=1), "127.0.0.1", 0)
    await server.start()
    try:
        for _ in range(50):  # connect, then abort with RST (linger 0) before any answer
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.connect(("127.0.0.1", server.port))
            s.close()
        await asyncio.sleep(0.05)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        assert await reader.read() == b"0.000"
        writer.close()
        await writer.wait_closed()
    finally:
        await server.stop()
    assert server.stats.answered == 51  # the aborted ones were counted as arrivals too


async def test_out_of_descriptors_pauses_accepting_then_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """EMFILE on accept: a rate-limited warning, the server keeps running, and the
    waiting client is answered once descriptors are free again."""
    import os
    import resource

    caplog.set_level(logging.WARNING, logger="smockron.jarl")
    server = JarlServer(Jarl(requests=5, period=1), "127.0.0.1", 0)
    await server.start()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    client = socket.socket()
    fillers: list[int] = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 4096), hard))
        with pytest.raises(OSError):
            while True:  # take every free descriptor
                fillers.append(os.open(os.devnull, os.O_RDONLY))
        client.settimeout(5)
        client.connect(("127.0.0.1", server.port))  # the kernel completes it, unaccepted
        await asyncio.sleep(0.03)  # the server tries to accept: no descriptor left
        assert server.stats.answered == 0
        assert "cannot accept connections" in caplog.text
        for fd in fillers:
            os.close(fd)
        fillers.clear()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        async with asyncio.timeout(5):
            while server.stats.answered == 0:  # accepting resumes after a pause
                await asyncio.sleep(0.01)
        assert client.recv(7) == b"0.000"
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        client.close()
        await server.stop()


def test_sighup_reads_the_limit_again(tmp_path: Path) -> None:
    """A real ``smockron jarl --config``: SIGHUP applies a new --requests/--period, keeps
    the arrivals it has seen, and a bad file changes nothing."""
    port = free_port()
    config = tmp_path / "jarl.toml"
    config.write_text("requests = 1\nperiod = 60\n")
    procs: list[Proc] = []
    with stopping(procs):
        procs.append(run_smockron(jarl_args(port, "--config", str(config)), tmp_path / "jarl.log"))
        proc = procs[0]
        wait_port(port)  # its connection is the one request a minute allows
        assert float(read_all(port)) > 59
        config.write_text("requests = 100\nperiod = 60\n")
        proc.popen.send_signal(signal.SIGHUP)
        wait_for(lambda: "reloaded requests=100 period=60" in proc.log(), 10)
        assert read_all(port) == b"0.000"
        config.write_text("requests = 0\n")
        proc.popen.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload failed, keeping the running limit" in proc.log(), 10)
        assert read_all(port) == b"0.000" and proc.alive()
