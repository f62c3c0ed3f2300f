"""The master's store watch: "answers again" follows an outage, never a start."""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import replace

import pytest

from smockron.master import server
from tests.master.running import running_master, settings
from tests.support import RedisServer, wait_for


def test_a_start_is_not_an_outage_that_ends(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, "smockron.master"), running_master(settings()) as master:
        wait_for(lambda: master.store_problem is None, 10)
        time.sleep(0.1)
    assert "answers again" not in caplog.text


def test_a_store_back_from_an_outage_is_logged(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(server, "STORE_CHECK_S", 0.1)
    monkeypatch.setattr(server, "STORE_DEADLINE_S", 0.3)
    assert redis_server.proc is not None
    pid = redis_server.proc.pid
    config = replace(settings(), store=redis_server.url)
    with caplog.at_level(logging.INFO, "smockron.master"), running_master(config) as master:
        wait_for(lambda: master.store_problem is None, 10)
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(lambda: master.store_problem is not None, 10)
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: master.store_problem is None, 10)
        wait_for(lambda: "answers again" in caplog.text, 5)
    assert caplog.text.count("answers again") == 1
