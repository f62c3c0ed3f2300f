"""``AsyncGatekeeper.aclose()`` never hangs, nor does dropping a gatekeeper unclosed.

The hangs are run in a child process with a timeout, so one fails the test instead of
hanging the suite. Real sockets: a fake master (tests.gatekeeper.conftest) on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from smockron.gatekeeper import AsyncGatekeeper
from tests.gatekeeper.conftest import MasterSockets
from tests.support import REPO_ROOT, smockron_env

SETUP = """
import asyncio, gc, logging, sys, time
from smockron.gatekeeper import AsyncGatekeeper
from tests.gatekeeper.conftest import make_master
from tests.support import free_ports

stuck = []
class Stuck(logging.Handler):
    def emit(self, record):
        if "did not stop" in record.getMessage():
            stuck.append(record)
logging.getLogger("smockron.gatekeeper").addHandler(Stuck())
master = make_master(*free_ports(2))

def started():
    loop = asyncio.new_event_loop()
    gk = AsyncGatekeeper(master.accounting_addr, master.control_addr, ["api"])

    async def start():
        gk.start()
        await asyncio.sleep(0.5)  # connected, subscribed

    loop.run_until_complete(start())
    return loop, gk
"""

LOOP_IDLE = (
    SETUP
    + """
ended = []
for _ in range(3):  # a race (readiness, timeout and cancellation in one turn): thrice
    loop, gk = started()
    for i in range(3):  # verdicts arrive while the loop is not running
        master.publish("api", b"x%d" % i, int(time.time() * 1000) + 60_000)
    time.sleep(1.2)  # the reader's 0.25 s timeout is due too when the loop runs again
    tasks = list(gk._tasks)
    loop.run_until_complete(gk.aclose())
    ended.append(all(t.done() for t in tasks))
    loop.close()
print("closed", all(ended), len(stuck))
master.close()
"""
)

DROPPED = (
    SETUP
    + """
loop, gk = started()
loop.close()
del gk, loop
gc.collect()
print("collected")
master.close()
"""
)


def _run(script: str) -> str:
    try:
        done = subprocess.run(
            [sys.executable, "-c", script],
            cwd=REPO_ROOT,
            env=smockron_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"hung: {exc.stderr!r}") from None
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_aclose_after_the_loop_stood_still_ends_every_task() -> None:
    """A loop driven by run_until_complete: the reader task's wait is cancelled while
    the control socket became readable and its timeout fell due (asyncio.wait_for on
    3.11 returned instead of raising, and the task never ended)."""
    assert _run(LOOP_IDLE).split() == ["closed", "True", "0"]


def test_a_gatekeeper_dropped_without_aclose_is_collected() -> None:
    """Its context is no longer terminated by the garbage collector with its sockets
    open (which hung the process at the next gc.collect())."""
    assert _run(DROPPED).split() == ["collected"]


async def test_a_cancelled_aclose_is_cancelled_and_still_closes(master: MasterSockets) -> None:
    gk = AsyncGatekeeper(master.accounting_addr, master.control_addr, ["api"])
    gk.start()
    await asyncio.sleep(0.2)
    closing = asyncio.create_task(gk.aclose())
    await asyncio.sleep(0)  # it has cancelled the readers and waits for them
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert gk._pub is None and gk._ctx is None  # closed all the same
