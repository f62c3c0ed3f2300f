"""``smockron top``: a live terminal view of a running master, read from its ``/stats``.

Two readings of the master's counters give each domain's accepted, delayed and rejected
rates; the master also reports its most throttled identifiers of the current window
(escaped on its side; shown here as plain text, never as markup).
"""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from types import FrameType
from typing import Any

import click
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from smockron.errors import SmockronError
from smockron.observe.http import parse_listen

Snapshot = dict[str, Any]
STATUSES = ("accepted", "delayed", "rejected")
FETCH_TIMEOUT_S = 3.0
MAX_BODY = 4 * 1024 * 1024


class FetchError(SmockronError):
    """The master's /stats could not be read."""


def stats_url(address: str) -> str:
    host, port = parse_listen(address)
    host = "127.0.0.1" if host == "0.0.0.0" else host
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/stats"


def fetch(url: str, timeout: float = FETCH_TIMEOUT_S) -> Snapshot:
    """One reading of the master's /stats."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read(MAX_BODY)
        data = json.loads(body)
    except (OSError, ValueError) as exc:  # URLError and HTTPError are OSErrors
        raise FetchError(f"cannot read {url}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("domains"), dict):
        raise FetchError(f"{url} did not answer with the master's stats")
    return data


def rates(before: Snapshot | None, after: Snapshot) -> dict[str, dict[str, float]]:
    """Per-domain rates (per second) between two readings; zero without a first one."""
    out: dict[str, dict[str, float]] = {}
    elapsed = float(after["time"]) - float(before["time"]) if before else 0.0
    for name, counts in after["domains"].items():
        old = (before or {}).get("domains", {}).get(name, {})
        out[name] = {
            s: (counts.get(s, 0) - old.get(s, 0)) / elapsed if elapsed > 0 else 0.0
            for s in (*STATUSES, "published")
        }
    return out


WIDTH = 80
"""What a frame fits in, whatever figures a master shows (tests render it at this width)."""
NAME_WIDTH = 16
"""Longer domain names are cut with an ellipsis (identifiers at ``IDENT_WIDTH``), so a
row stays on one line."""
IDENT_WIDTH = 40
COLUMNS = (*STATUSES, "published")
HEADERS = ("accepted", "delayed", "rejected", "DELAY_UNTILs")
"""The domains table's columns: the three verdicts, and the DELAY_UNTIL messages the
master sent (``published`` in /stats)."""


def _number(value: float, rate: bool = False) -> str:
    """At most 7 characters: 1234567 (12.5 for a rate), then 12.3M, 1.2G."""
    if value < 10_000_000:
        return f"{value:.1f}" if rate and value < 1000 else f"{value:.0f}"
    unit, size = ("G", 1e9) if value >= 1e9 else ("M", 1e6)
    return f"{value / size:.1f}{unit}" if value < 100 * size else f"{value / size:.0f}{unit}"


def _table(*headers: str) -> Table:
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    table.add_column(headers[0], max_width=NAME_WIDTH, overflow="ellipsis", no_wrap=True)
    for header in headers[1:]:
        table.add_column(header, justify="right", no_wrap=True)
    return table


def render(before: Snapshot | None, after: Snapshot, source: str) -> RenderableType:
    """One frame, at most ``WIDTH`` columns wide. Per domain two rows: the rate of each
    verdict per second since the last reading, and its total since the master started;
    the last column counts the DELAY_UNTIL messages it sent. Then the identifiers it
    sent the most DELAY_UNTILs in its current window of ``top_window_s`` seconds (the
    counts restart with each window, so the figures cover up to that long)."""
    per_second = rates(before, after)
    domains = _table("domain", "", *HEADERS)
    for name, counts in sorted(after["domains"].items()):
        domains.add_row(
            Text(name), "per s", *(_number(per_second[name][c], rate=True) for c in COLUMNS)
        )
        domains.add_row("", "total", *(_number(int(counts.get(c, 0))) for c in COLUMNS))
    window = after.get("top_window_s", 0)
    heading = Text(f"most throttled: DELAY_UNTILs sent per identifier, current {window:g} s window")
    top = _table("domain", "identifier", "DELAY_UNTILs")
    ident = top.columns[1]
    ident.justify, ident.max_width, ident.overflow = "left", IDENT_WIDTH, "ellipsis"
    for name, rows in sorted(after.get("top", {}).items()):
        for ident_text, count in rows:
            top.add_row(Text(name), Text(str(ident_text)), _number(int(count)))
    footer = Text(
        f"queue {after.get('queue_depth', 0)}  dropped {after.get('dropped', 0)}  "
        f"malformed {after.get('malformed', 0)}  unknown domain {after.get('unknown_domain', 0)}"
    )
    return Group(Text(f"smockron master {source}"), domains, heading, top, footer)


def _error_frame(exc: Exception, last: RenderableType | None) -> RenderableType:
    line = Text(str(exc), style="bold red")
    return line if last is None else Group(last, line)


class _Interrupted:
    """Ctrl-C as a flag the view's loop reads between frames. Raised as
    KeyboardInterrupt wherever the main thread happens to be, it could land inside rich's
    locks while the refresh thread holds the other one, and the view then never ended."""

    def __init__(self) -> None:
        self.seen = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.seen = True

    def sleep(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; whether Ctrl-C came (it ends the sleep within 0.1 s)."""
        deadline = time.monotonic() + seconds
        while not self.seen and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))
        return self.seen


def run_live(url: str, source: str, interval: float, console: Console, stop: _Interrupted) -> None:
    """Frames until ``stop`` has seen Ctrl-C; the view is then closed in order."""
    before = fetch(url)
    frame: RenderableType = render(None, before, source)
    with Live(
        frame, console=console, refresh_per_second=4, redirect_stdout=False, redirect_stderr=False
    ) as live:
        while not stop.sleep(interval):
            try:
                after = fetch(url)
            except FetchError as exc:
                live.update(_error_frame(exc, frame))
                continue
            frame = render(before, after, source)
            live.update(frame)
            before = after


@click.command()
@click.argument("address", metavar="HOST:PORT")
@click.option(
    "--interval",
    type=click.FloatRange(0.1, 3600),
    default=2.0,
    show_default=True,
    help="Seconds between two readings.",
)
@click.option("--once", is_flag=True, help="Print one frame (rates over one interval), exit.")
def top(address: str, interval: float, once: bool) -> None:
    """Live per-domain rates and most throttled identifiers of a master.

    HOST:PORT is the master's --metrics listener; it serves the /stats read here.
    """
    console = Console()
    try:
        url = stats_url(address)
        if once:
            before = fetch(url)
            time.sleep(interval)
            console.print(render(before, fetch(url), address))
            return
        stop = _Interrupted()
        previous = signal.signal(signal.SIGINT, stop)
        try:
            run_live(url, address, interval, console, stop)
        finally:
            signal.signal(signal.SIGINT, previous)
        if stop.seen:
            raise SystemExit(130)
    except SmockronError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:  # --once, or Ctrl-C before the view
        raise SystemExit(130) from None
