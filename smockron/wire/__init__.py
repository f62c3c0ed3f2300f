"""The Smockron wire protocol, once: the codec (accounting, control, rules offers), the
batch ZeroMQ I/O, and the accounting decode done while receiving (compiled, or its
pure-Python twin, behind one contract).

- :mod:`smockron.wire.codec`: frames in and out, pure; every malformed message raises
  :class:`~smockron.errors.ProtocolError`.
- :mod:`smockron.wire.batchio`: draining and sending whole batches without blocking.
- :mod:`smockron.wire.accounting`: records and raw messages, as the master consumes them.
- :mod:`smockron.wire.control`: DELAY_UNTILs decoded while received (the gatekeepers) and
  encoded while sent (the master's RESYNC answers).
"""

from __future__ import annotations

from smockron.wire.accounting import Record, drain_accounting, split_accounting
from smockron.wire.batchio import drain, send_all, wait_readable
from smockron.wire.codec import (
    ACCEPTED,
    DEFAULT_LIMITS,
    DELAY_UNTIL,
    DELAYED,
    REJECTED,
    RULES,
    RULES_TOPIC,
    Accounting,
    AccountingStatus,
    Control,
    Limits,
    RulesOffer,
    control_frames,
    decode_accounting,
    decode_control,
    decode_rules,
    encode_accounting,
    encode_control,
    encode_rules,
    topic,
)

__all__ = [
    "ACCEPTED",
    "DEFAULT_LIMITS",
    "DELAYED",
    "DELAY_UNTIL",
    "REJECTED",
    "RULES",
    "RULES_TOPIC",
    "Accounting",
    "AccountingStatus",
    "Control",
    "Limits",
    "Record",
    "RulesOffer",
    "control_frames",
    "decode_accounting",
    "decode_control",
    "decode_rules",
    "drain",
    "drain_accounting",
    "encode_accounting",
    "encode_control",
    "encode_rules",
    "send_all",
    "split_accounting",
    "topic",
    "wait_readable",
]
