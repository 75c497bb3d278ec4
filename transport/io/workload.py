"""What a sender sends: the `Workload`, and generated messages whose content a receiver can verify."""

from __future__ import annotations

from dataclasses import dataclass

from transport.io.eventloop import EndpointError

# Sequence-number prefix of generated messages: lets receivers verify content and lets request /
# response workloads match a response to its request in unordered delivery.
SEQ_LEN = 8
_PATTERN = bytes(range(256)) * 2


@dataclass
class Workload:
    """What a sender sends.

    bulk:        `total_bytes` > 0, split into messages of `size` bytes, kept flowing closed-loop.
    messages:    `messages` messages of `size` bytes (0 = until the duration ends); open loop at
                 `rate` messages/s, or closed loop with `outstanding` messages unacknowledged.
    request_response: each message waits for a response from the receiver (echo or fixed size),
                 which is what counts as its completion.
    """

    total_bytes: int = 0
    messages: int = 0
    size: int = 65536
    rate: float = 0.0
    outstanding: int = 0
    request_response: bool = False

    def validate(self) -> None:
        if self.total_bytes < 0:
            raise EndpointError(f"bytes must be >= 0, got {self.total_bytes}")
        if self.messages < 0:
            raise EndpointError(f"messages must be >= 0, got {self.messages}")
        if self.size < 1:
            raise EndpointError(f"message size must be >= 1, got {self.size}")
        if self.rate < 0:
            raise EndpointError(f"rate must be >= 0, got {self.rate}")
        if self.outstanding < 0:
            raise EndpointError(f"outstanding must be >= 0, got {self.outstanding}")
        if self.request_response and self.size < SEQ_LEN:
            raise EndpointError(f"request/response messages need at least {SEQ_LEN} bytes")

    @property
    def unbounded(self) -> bool:
        return self.total_bytes == 0 and self.messages == 0


def make_payload(seq: int, size: int) -> bytes:
    """A message of `size` bytes: big-endian `seq`, then a pattern that shifts with `seq`."""
    head = seq.to_bytes(SEQ_LEN, "big")
    if size <= SEQ_LEN:
        return head[:size]
    body_len = size - SEQ_LEN
    start = seq & 0xFF
    if body_len <= 256:
        return head + _PATTERN[start : start + body_len]
    reps, rest = divmod(body_len, 256)
    block = _PATTERN[start : start + 256]
    return head + block * reps + block[:rest]


def payload_seq(data: bytes) -> int:
    return int.from_bytes(data[:SEQ_LEN], "big")


def check_payload(data: bytes) -> bool:
    """True when `data` is exactly what `make_payload` produces for its own sequence prefix."""
    return len(data) >= SEQ_LEN and data == make_payload(payload_seq(data), len(data))
