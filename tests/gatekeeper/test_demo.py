"""`smockron demo` end to end, shortened: its summary tells the story."""

from __future__ import annotations

import re

from smockron.core.rules import Rule
from smockron.demo import Scenario, Tally, held, table
from tests.support import smockron_run


def test_demo_short_run() -> None:
    out = smockron_run(["demo", "--duration", "4"])
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


def test_the_live_table_and_the_summary_count_the_same_thing() -> None:
    """What reached the backend, against what the rule allows: the final table and the
    summary count the same window the same way (a request held past the end of the
    traffic arrives too late for either; the allowance is whole in both)."""
    scenario = Scenario(Rule(5.0, 10), 4.0, 3.0, 40.0)
    tally = Tally()
    t0 = 1000.0
    tally.arrivals["abusive"] = [t0 + 0.1 * i for i in range(35)] + [t0 + 4.5, t0 + 5.0]
    tally.counts[("abusive", "gk1", "accept")] = 30
    tally.counts[("abusive", "gk2", "delay")] = 7
    tally.counts[("abusive", "gk2", "reject")] = 120
    final = table(tally, scenario, t0, scenario.duration_s)
    row = re.search(r"^  abusive +(\d+) +(\d+)$", final, re.MULTILINE)
    assert row is not None, final
    summary = "\n".join(held(tally, scenario, t0, "abusive", "8x its rule"))
    said = re.search(r"(\d+) reached the backend in 4 s; the rule allows (\d+) ", summary)
    assert said is not None, summary
    assert (row.group(1), row.group(2)) == (said.group(1), said.group(2)) == ("35", "30")
    assert "held to 1.17x its rule" in summary
    live = table(tally, scenario, t0, 2.0)  # two seconds in (0.0 to 2.0 s: 21 arrived)
    assert re.search(r"^  abusive +21 +20$", live, re.MULTILINE), live
