"""`smockron demo` end to end, shortened: its summary tells the story."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support import REPO_ROOT, smockron_env


def test_demo_short_run() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "smockron", "demo", "--duration", "4"],
        capture_output=True,
        text=True,
        env=smockron_env(),
        cwd=REPO_ROOT,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "accepted" in text and "rejected" in text  # the live table
    assert "well-behaved client: never slowed" in text, text
    held = re.search(r"(\d+) reached the backend in 4 s; the rule allows (\d+)", text)
    assert held is not None, text
    through, ideal = int(held.group(1)), int(held.group(2))
    assert ideal == 10 + 5 * 4
    # held to its rule: not far above it (160 were sent), and not starved below it
    assert 0.6 * ideal <= through <= 1.25 * ideal, text
    ratio = re.search(r"held to (\d+\.\d+)x its rule", text)
    assert ratio is not None and abs(float(ratio.group(1)) - through / ideal) < 0.01
    assert re.search(r"abusive client: \d+ delayed, [1-9]\d* rejected", text), text

    # the bursty client: in the live table, and in the summary beside its allowance
    assert re.search(r"^  bursty +gk1 ", text, re.MULTILINE), text
    assert re.search(r"^  bursty +\d+ +\d+$", text, re.MULTILINE), text  # backend vs allowance
    bursty = re.search(
        r"bursty client: sent (\d+) requests \(20 at once every 250 ms, 16x its rule\), "
        r"(\d+) reached the backend in 4 s; the rule allows (\d+) .*: held to (\d+\.\d+)x",
        text,
    )
    assert bursty is not None, text
    sent, through, ideal = (int(bursty.group(i)) for i in (1, 2, 3))
    assert ideal == 10 + 5 * 4 and 0 < sent <= 16 * 20, text
    assert 0.6 * ideal <= through <= 1.25 * ideal, text  # held to its rule, bursts and all
    assert abs(float(bursty.group(4)) - through / ideal) < 0.01
    assert re.search(r"bursty client: \d+ delayed, \d+ rejected", text), text
