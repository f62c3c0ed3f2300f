"""A minimal gatekeeper for tests: PUB accounting to a master, SUB its control."""

from __future__ import annotations

import time
from types import TracebackType

import zmq

from smockron.wire.codec import (
    ACCEPTED,
    PUBLISHED,
    RULES_TOPIC,
    Control,
    RulesOffer,
    decode_control,
    decode_published,
    decode_rules,
    encode_accounting,
)


def now_ms() -> int:
    return int(time.time() * 1000)


class FakeGatekeeper:
    """Real sockets on 127.0.0.1; ``handshake`` waits out the PUB/SUB slow joiner."""

    def __init__(self, accounting_port: int, control_port: int) -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 0)
        self.pub.connect(f"tcp://127.0.0.1:{accounting_port}")
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.subscribe(b"")
        self.sub.connect(f"tcp://127.0.0.1:{control_port}")
        self._probe = 0
        self.offers: list[RulesOffer] = []
        """The master's rules offers received (kept apart from the control messages)."""
        self.published: list[tuple[bytes, int]] = []
        """The master's publish counters received (domain, count), also set aside."""

    def _control(self, timeout: float) -> Control | None:
        """The next DELAY_UNTIL within ``timeout`` seconds; rules offers are set aside."""
        deadline = time.monotonic() + timeout
        while self.sub.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            frames = self.sub.recv_multipart()
            if frames[0] == RULES_TOPIC:
                if frames[1] == PUBLISHED:
                    self.published.append(decode_published(frames))
                else:
                    self.offers.append(decode_rules(frames))
                continue
            return decode_control(frames)
        return None

    def send(self, frames: list[bytes]) -> None:
        self.pub.send_multipart(frames)

    def accepted(self, domain: str, ident: bytes, ts: int | None = None) -> None:
        self.send(encode_accounting(domain, ACCEPTED, ident, now_ms() if ts is None else ts))

    def handshake(self, domain: str = "probe", timeout: float = 15.0) -> None:
        """Send probes (a domain with burst 1) until a DELAY_UNTIL comes back for one:
        then both subscriptions are live and nothing sent after it is lost."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._probe += 1
            self.accepted(domain, b"probe-%d" % self._probe)
            if self._control(0.1) is not None:
                self.drain_control(0.2)
                return
        raise AssertionError(f"no DELAY_UNTIL for probe domain {domain!r} in {timeout}s")

    def drain_control(self, quiet: float = 0.3, timeout: float = 10.0) -> list[Control]:
        """Control messages until none arrives for ``quiet`` seconds."""
        out: list[Control] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (msg := self._control(quiet)) is not None:
            out.append(msg)
        return out

    def expect_control(self, n: int, timeout: float = 10.0) -> list[Control]:
        """Exactly ``n`` control messages that are not probes, within ``timeout``."""
        out: list[Control] = []
        deadline = time.monotonic() + timeout
        while len(out) < n and time.monotonic() < deadline:
            msg = self._control(0.05)
            if msg is not None and not msg.domain.startswith(b"probe"):
                out.append(msg)
        return out

    def close(self) -> None:
        self.pub.close()
        self.sub.close()
        self.ctx.term()

    def __enter__(self) -> FakeGatekeeper:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
