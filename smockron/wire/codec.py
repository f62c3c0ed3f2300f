"""The Smockron wire codec: accounting and control messages as ZeroMQ frames.

Accounting (gatekeeper PUB -> master SUB, tcp:10004)::

    domain\\0 | ACCEPTED|DELAYED|REJECTED | identifier | receive ms | delayed ms or b"" | [loginfo]

Control (master PUB -> gatekeeper SUB, tcp:10005)::

    domain\\0 | DELAY_UNTIL | identifier | timestamp ms

Resync (the original Smockron's ``resync`` branch)::

    domain\0 | RESYNC                         gatekeeper -> master, on accounting
    domain\0 | RESYNCSTART                    master -> gatekeepers, on control
    domain\0 | DELAY_UNTIL | identifier | ms  one per identifier still delayed
    domain\0 | RESYNCDONE

Rules offer and publish counter (master PUB -> gatekeeper SUB, smockron's additions)::

    \0smockron\0 | RULES | domain | algorithm | "RATE BURST" ...
    \0smockron\0 | PUBLISHED | domain | DELAY_UNTILs published for it since start

The master offers each domain's rules so that gatekeepers can hold one identifier to
its rule between two verdicts. The topic starts with a NUL, so it never matches the
subscription of a gatekeeper that subscribes to its domains (``domain\0``), as the
original Node middleware and nginx module do: they never receive it.

Timestamps are milliseconds since 1970 in ASCII decimal. Identifiers are opaque bytes.
Pure code: no sockets here, only frames in and out. Every malformed message raises
:class:`~smockron.errors.ProtocolError` whose ``reason`` is a stable metric label.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Final

from smockron.core.rules import Rule
from smockron.errors import ProtocolError, RuleError

__all__ = [
    "ACCEPTED",
    "DEFAULT_LIMITS",
    "DELAYED",
    "DELAY_UNTIL",
    "MAX_FRAMES",
    "MAX_OFFERED_RATE",
    "MAX_OFFERED_RULES",
    "MIN_OFFERED_RATE",
    "PUBLISHED",
    "REJECTED",
    "RESYNC",
    "RESYNCDONE",
    "RESYNCSTART",
    "RULES",
    "RULES_TOPIC",
    "STATUSES",
    "Accounting",
    "AccountingStatus",
    "Control",
    "Limits",
    "Oversized",
    "RulesOffer",
    "accounting_frames",
    "control_frames",
    "decode_accounting",
    "decode_control",
    "decode_domain",
    "decode_published",
    "decode_rules",
    "decode_timestamp",
    "encode_accounting",
    "encode_control",
    "encode_published",
    "encode_resync",
    "encode_rules",
    "frame_count",
    "topic",
]

ACCEPTED: Final = b"ACCEPTED"
DELAYED: Final = b"DELAYED"
REJECTED: Final = b"REJECTED"
DELAY_UNTIL: Final = b"DELAY_UNTIL"
RESYNC: Final = b"RESYNC"
RESYNCSTART: Final = b"RESYNCSTART"
RESYNCDONE: Final = b"RESYNCDONE"
RESYNC_MARKS: Final = frozenset({RESYNCSTART, RESYNCDONE})

STATUSES: Final = frozenset({ACCEPTED, DELAYED, REJECTED})

RULES_TOPIC: Final = b"\0smockron\0"
RULES: Final = b"RULES"
PUBLISHED: Final = b"PUBLISHED"
MAX_COUNT_DIGITS: Final = 20
"""A publish counter of more digits is refused (2**64 has 20)."""
MAX_OFFERED_RULES: Final = 64
MAX_FRAMES: Final = 4 + MAX_OFFERED_RULES
"""The most frames of a valid message (a RULES offer of ``MAX_OFFERED_RULES`` rules): a
reader keeps this many frames of a message and only counts the rest."""
MIN_OFFERED_RATE: Final = 1e-9
"""Requests per second: about one in 30 years; below it the times overflow."""
MAX_OFFERED_RATE: Final = 1e9


class AccountingStatus(Enum):
    """The status field of an accounting message (what the gatekeeper did)."""

    ACCEPTED = ACCEPTED
    DELAYED = DELAYED
    REJECTED = REJECTED


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on what a decoder accepts; anything larger is hostile or broken."""

    max_domain: int = 256
    max_identifier: int = 1024
    max_loginfo: int = 8192
    max_timestamp_ms: int = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
    max_timestamp_digits: int = 16


DEFAULT_LIMITS: Final = Limits()


@dataclass(frozen=True, slots=True)
class Accounting:
    """One accounting message. ``domain`` is without its trailing NUL."""

    domain: bytes
    status: bytes
    identifier: bytes
    received_ms: int
    delayed_ms: int | None = None
    loginfo: bytes | None = None

    @property
    def effective_ms(self) -> int:
        """The timestamp the history records: delayed time if delayed, else receive time."""
        return self.delayed_ms if self.delayed_ms is not None else self.received_ms


@dataclass(frozen=True, slots=True)
class Control:
    """One control message: DELAY_UNTIL, or the RESYNCSTART/RESYNCDONE marks around a
    resync (no identifier, ``until_ms`` 0). ``domain`` is without its NUL."""

    domain: bytes
    identifier: bytes
    until_ms: int
    command: bytes = DELAY_UNTIL


class Oversized(list[bytes]):
    """The first ``MAX_FRAMES`` frames of a longer message, as a batch reader keeps them;
    ``total`` is how many frames it had (the rest were read and dropped), so the
    decoders name its real length."""

    __slots__ = ("total",)

    def __init__(self, frames: Iterable[bytes], total: int) -> None:
        super().__init__(frames)
        self.total = total


def frame_count(frames: Sequence[bytes]) -> int:
    """How many frames a message had, also when a reader kept only the first ones."""
    return frames.total if type(frames) is Oversized else len(frames)


def topic(domain: bytes | str) -> bytes:
    """The pub/sub topic for a domain: its bytes plus a trailing NUL."""
    raw = domain.encode() if isinstance(domain, str) else domain
    if b"\0" in raw:
        raise ProtocolError("domain_nul", f"domain {raw!r} contains a NUL byte")
    return raw + b"\0"


def encode_accounting(
    domain: bytes | str,
    status: bytes,
    identifier: bytes,
    received_ms: int,
    delayed_ms: int | None = None,
    loginfo: bytes | None = None,
) -> list[bytes]:
    """Frames for one accounting message."""
    if status not in STATUSES:
        raise ProtocolError("bad_status", f"unknown status {status!r}")
    if (status == DELAYED) != (delayed_ms is not None):
        raise ProtocolError("delayed_ts", "a delayed timestamp goes with DELAYED and only DELAYED")
    return accounting_frames(topic(domain), status, identifier, received_ms, delayed_ms, loginfo)


def accounting_frames(
    topic_frame: bytes,
    status: bytes,
    identifier: bytes,
    received_ms: int,
    delayed_ms: int | None,
    loginfo: bytes | None,
) -> list[bytes]:
    """The frames of :func:`encode_accounting`, unchecked: for senders whose status and
    timestamps are their own and whose topic frame was made (and checked) once."""
    frames = [
        topic_frame,
        status,
        identifier,
        b"%d" % received_ms,
        b"" if delayed_ms is None else b"%d" % delayed_ms,
    ]
    if loginfo is not None:
        frames.append(loginfo)
    return frames


def encode_control(domain: bytes | str, identifier: bytes, until_ms: int) -> list[bytes]:
    """Frames for one DELAY_UNTIL control message."""
    return control_frames(topic(domain), identifier, until_ms)


def control_frames(topic_frame: bytes, identifier: bytes, until_ms: int) -> list[bytes]:
    """The frames of :func:`encode_control`, unchecked: for the master, whose topic
    frames were made (and checked) once per configuration."""
    return [topic_frame, DELAY_UNTIL, identifier, b"%d" % until_ms]


def encode_resync(domain: bytes | str) -> list[bytes]:
    """A gatekeeper's request for the master's live verdicts of ``domain``."""
    return [topic(domain), RESYNC]


def encode_published(domain: bytes | str, count: int) -> list[bytes]:
    """The master's heartbeat of how many DELAY_UNTILs it published for ``domain``."""
    name = domain.encode() if isinstance(domain, str) else domain
    return [RULES_TOPIC, PUBLISHED, name, b"%d" % count]


def decode_published(frames: Sequence[bytes], limits: Limits = DEFAULT_LIMITS) -> tuple[bytes, int]:
    """(domain, count) of a PUBLISHED heartbeat."""
    n = frame_count(frames)
    if n != 4 or frames[0] != RULES_TOPIC or frames[1] != PUBLISHED:
        raise ProtocolError("frame_count", f"PUBLISHED has {n} frames, expected 4")
    domain = decode_domain(frames[2] + b"\0", limits)
    count = frames[3]
    if not count.isdigit() or len(count) > MAX_COUNT_DIGITS:
        raise ProtocolError("bad_count", f"PUBLISHED count {count[:32]!r} for {domain[:64]!r}")
    return domain, int(count)


def decode_domain(frame: bytes, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """Strip and check the trailing NUL of a domain frame."""
    if not frame.endswith(b"\0"):
        raise ProtocolError("domain_nul", f"domain frame {frame[:64]!r} lacks its trailing NUL")
    domain = frame[:-1]
    if not domain:
        raise ProtocolError("domain_empty", "empty domain")
    if len(domain) > limits.max_domain:
        raise ProtocolError("oversized", f"domain of {len(domain)} bytes > {limits.max_domain}")
    if b"\0" in domain:
        raise ProtocolError("domain_nul", f"domain {domain[:64]!r} contains a NUL byte")
    return domain


def decode_timestamp(frame: bytes, what: str, limits: Limits = DEFAULT_LIMITS) -> int:
    """ASCII decimal milliseconds, nothing else: no sign, spaces, or exponent."""
    if not frame:
        raise ProtocolError("bad_timestamp", f"empty {what}")
    if len(frame) > limits.max_timestamp_digits:
        raise ProtocolError("bad_timestamp", f"{what} {frame[:32]!r} is too long")
    if not frame.isdigit():  # bytes.isdigit is ASCII-only
        raise ProtocolError("bad_timestamp", f"{what} {frame[:32]!r} is not ASCII decimal")
    value = int(frame)
    if value > limits.max_timestamp_ms:
        raise ProtocolError("bad_timestamp", f"{what} {value} is past year 9999")
    return value


def decode_accounting(frames: Sequence[bytes], limits: Limits = DEFAULT_LIMITS) -> Accounting:
    """Decode and validate the frames of one accounting message."""
    n = frame_count(frames)
    if n != 5 and n != 6:
        raise ProtocolError("frame_count", f"accounting message has {n} frames, expected 5 or 6")
    domain_f, status, identifier, received_f, delayed_f = frames[:5]
    domain = decode_domain(domain_f, limits)
    if status not in STATUSES:
        raise ProtocolError("bad_status", f"unknown status {status[:32]!r}")
    if len(identifier) > limits.max_identifier:
        raise ProtocolError(
            "oversized", f"identifier of {len(identifier)} bytes > {limits.max_identifier}"
        )
    received = decode_timestamp(received_f, "receive timestamp", limits)
    delayed: int | None = None
    if status == DELAYED:
        if not delayed_f:
            raise ProtocolError("delayed_ts", "DELAYED message without a delayed timestamp")
        delayed = decode_timestamp(delayed_f, "delayed timestamp", limits)
    elif delayed_f:
        raise ProtocolError("delayed_ts", f"{status.decode()} message with a delayed timestamp")
    loginfo: bytes | None = None
    if n == 6:
        loginfo = frames[5]
        if len(loginfo) > limits.max_loginfo:
            raise ProtocolError(
                "oversized", f"loginfo of {len(loginfo)} bytes > {limits.max_loginfo}"
            )
    return Accounting(domain, status, identifier, received, delayed, loginfo)


def decode_control(frames: Sequence[bytes], limits: Limits = DEFAULT_LIMITS) -> Control:
    """Decode and validate the frames of one control message."""
    n = frame_count(frames)
    if n < 2:
        raise ProtocolError("frame_count", f"control message has {n} frames, expected 4")
    domain = decode_domain(frames[0], limits)
    command = frames[1]
    if command in RESYNC_MARKS:
        if n != 2:
            raise ProtocolError("frame_count", f"{command.decode()} has {n} frames")
        return Control(domain, b"", 0, command)
    if command != DELAY_UNTIL:
        raise ProtocolError("bad_command", f"unknown command {command[:32]!r}")
    if n != 4:
        raise ProtocolError("frame_count", f"DELAY_UNTIL has {n} frames, expected 4")
    identifier = frames[2]
    if len(identifier) > limits.max_identifier:
        raise ProtocolError(
            "oversized", f"identifier of {len(identifier)} bytes > {limits.max_identifier}"
        )
    until = decode_timestamp(frames[3], "DELAY_UNTIL timestamp", limits)
    return Control(domain, identifier, until)


@dataclass(frozen=True, slots=True)
class RulesOffer:
    """A domain's rules and algorithm, as the master offers them to gatekeepers."""

    domain: bytes
    algorithm: str
    rules: tuple[Rule, ...]


def encode_rules(domain: bytes | str, algorithm: str, rules: tuple[Rule, ...]) -> list[bytes]:
    """Frames of one RULES offer; a rate is written exactly (``repr`` of its float)."""
    name = domain.encode() if isinstance(domain, str) else domain
    return [
        RULES_TOPIC,
        RULES,
        name,
        algorithm.encode(),
        *(f"{rule.rate!r} {rule.burst}".encode() for rule in rules),
    ]


def decode_rules(frames: Sequence[bytes], limits: Limits = DEFAULT_LIMITS) -> RulesOffer:
    """Decode and validate one RULES offer."""
    n = frame_count(frames)
    if n < 5 or frames[0] != RULES_TOPIC or frames[1] != RULES:
        raise ProtocolError("frame_count", f"RULES offer has {n} frames, expected 5+")
    if n > 4 + MAX_OFFERED_RULES:
        raise ProtocolError("oversized", f"RULES offer of {n - 4} rules")
    domain = decode_domain(frames[2] + b"\0", limits)
    try:
        algorithm = frames[3].decode("ascii")
        rules = tuple(_decode_rule(frame) for frame in frames[4:])
    except (UnicodeDecodeError, ValueError, RuleError) as exc:
        raise ProtocolError("bad_rule", f"RULES offer for {domain[:64]!r}: {exc}") from None
    return RulesOffer(domain, algorithm, rules)


def _decode_rule(frame: bytes) -> Rule:
    rate, burst = frame.split(b" ")
    if len(frame) > 64 or not burst.isdigit():
        raise ValueError(f"bad rule {frame[:64]!r}")
    value = float(rate)
    if not MIN_OFFERED_RATE <= value <= MAX_OFFERED_RATE or len(burst) > 9:
        raise ValueError(f"rate or burst out of range in {frame[:64]!r}")
    return Rule(value, int(burst))
