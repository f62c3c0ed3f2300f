"""Command lines for the gatekeeper's end-to-end tests, written once."""

from __future__ import annotations


def proxy_args(
    port: int,
    upstream: int,
    accounting: str,
    control: str,
    *extra: str,
    domain: str = "api",
    max_delay: str | None = "1s",
    identify: str | None = "header:X-Client",
) -> list[str]:
    """``smockron proxy`` on ``port`` in front of ``upstream``, clients told by X-Client
    (``identify``); None leaves ``identify`` or ``max_delay`` to the proxy's defaults."""
    return [
        "proxy",
        "--listen",
        f"127.0.0.1:{port}",
        "--upstream",
        f"http://127.0.0.1:{upstream}",
        "--domain",
        domain,
        "--accounting",
        accounting,
        "--control",
        control,
        *(("--identify", identify) if identify is not None else ()),
        *(("--max-delay", max_delay) if max_delay is not None else ()),
        *extra,
    ]
