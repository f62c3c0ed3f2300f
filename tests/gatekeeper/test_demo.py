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
