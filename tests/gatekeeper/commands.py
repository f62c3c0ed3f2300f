"""Command lines for the gatekeeper's end-to-end tests, written once."""

from __future__ import annotations


def proxy_args(
    port: int,
    upstream: int,
    accounting: str,
    control: str,
    *extra: str,
    domain: str = "api",
    max_delay: str = "1s",
) -> list[str]:
    """``smockron proxy`` on ``port`` in front of ``upstream``, clients told by X-Client."""
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
        "--identify",
        "header:X-Client",
        "--max-delay",
        max_delay,
        *extra,
    ]
