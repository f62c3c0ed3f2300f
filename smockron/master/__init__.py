"""The Smockron master: applies the rules to accounting messages, publishes DELAY_UNTIL.

Layers, innermost first: ``engine`` (pure: frames and ``now`` in, control frames out;
the rules it applies per message in ``apply``, its domains in ``domains``),
``stores`` (where histories live: memory or Redis), ``server`` (the ZeroMQ loop),
``router`` (shards accounting over several masters) and ``cli`` (the click commands).
"""

from __future__ import annotations

from smockron.master.domains import DomainPolicy
from smockron.master.engine import Engine
from smockron.master.server import Master
from smockron.master.stats import DomainStats, Stats

__all__ = ["DomainPolicy", "DomainStats", "Engine", "Master", "Stats"]
