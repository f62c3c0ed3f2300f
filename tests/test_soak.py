"""Every listener under hostile input, as ``bench/soak.py`` runs it, at a smaller scale.

Real daemons on 127.0.0.1 get fuzzed messages (``bench/fuzz.py``) with a valid request
every 1,000 whose answer is checked. Each must stay alive, answer every valid request
correctly, count the bad input, and keep its log free of the input's raw control bytes:
the fuzz follows every newline it writes with ``FORGED``, so a log line starting with
that was forged.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))  # the bench scripts import each other by name
import soak

# 10,000 messages per listener; the HTTP gateway answers ~600 a second on a 2-core
# machine, so it gets 3,000, and the threaded gRPC server (the same handlers as the
# native one, which gets 10,000) 1,000, enough to count its unknown methods
CASES = [
    ("master", 10_000, {"malformed"}),
    ("proxy", 10_000, {"control_malformed"}),
    ("dthrottle", 10_000, {"overlong"}),
    ("jarl", 10_000, set()),
    ("cluster-http", 3_000, {"malformed"}),
    ("cluster-grpc", 10_000, {"malformed", "unknown_method"}),
    ("cluster-grpc-threads", 1_000, {"malformed", "unknown_method"}),
]


@pytest.mark.slow
@pytest.mark.parametrize(("listener", "messages", "counted"), CASES, ids=[c[0] for c in CASES])
def test_listener_survives_hostile_input(
    tmp_path: Path, listener: str, messages: int, counted: set[str]
) -> None:
    result = soak.run(listener, tmp_path, messages, seconds=60.0, check_every=1000, seed=7)
    log = result.log.decode("utf-8", "replace")
    assert result.alive, log[-3000:]
    assert result.sent == messages
    assert result.checks == messages // 1000
    assert result.checks_ok == result.checks, log[-3000:]
    assert soak.forged_lines(result.log) == []
    for name in counted:  # the daemon saw the bad input and counted it
        assert result.counters[name] > 0, result.counters
    if listener == "jarl":  # reads nothing: every answer read must have been right
        assert result.counters == {"wrong_answers": 0}
    else:  # and said so in its log, rate-limited
        assert 1 <= result.bad_input_lines <= 100, log[-3000:]
