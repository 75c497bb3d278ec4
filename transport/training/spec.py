"""What a training job is: its steps, compute time, collective, data ingest, checkpoints and timeout."""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

from transport.training.collective import COLLECTIVES, CollectiveSpec

CHECKPOINT_MODES = ("sync", "async")


class SpecError(ValueError):
    """A job setting the model cannot run with; the message names it and the fix."""


@dataclass(frozen=True)
class JobSpec:
    """The job every rank runs.

    Every step a rank waits for its `data_bytes` of input (read from its data host; with `prefetch`
    the next step's read starts as this step's compute does, so it overlaps), computes for
    `compute_s` (the modelled GPU time), then takes part in the collective. After every
    `checkpoint_every`-th step it writes `checkpoint_bytes` to its checkpoint host: `sync` blocks the
    step until the write is in; `async` lets the next steps run while it goes on, but a checkpoint
    waits for the previous one. A collective that has not finished `collective_timeout_s` after it
    started fails the step (as NCCL's watchdog does) and the job restarts from the last checkpoint
    every rank has written, reading it back first.
    """

    steps: int = 20
    compute_s: float = 0.05
    collective: CollectiveSpec = field(default_factory=CollectiveSpec)
    data_bytes: int = 64 * 1024
    prefetch: bool = True
    checkpoint_every: int = 5  # 0: never
    checkpoint_bytes: int = 1 << 20
    checkpoint_mode: str = "sync"
    collective_timeout_s: float = 5.0

    def validate(self) -> None:
        if self.steps < 1:
            raise SpecError(f"steps={self.steps}: use at least 1")
        if self.compute_s < 0:
            raise SpecError(f"compute_s={self.compute_s}: use a number of seconds >= 0")
        if self.collective.name not in COLLECTIVES:
            raise SpecError(f"collective={self.collective.name!r}: use one of {', '.join(COLLECTIVES)}")
        if self.collective.nbytes < 4:
            raise SpecError(f"collective bytes={self.collective.nbytes}: use at least 4 (one float32)")
        if self.data_bytes < 0 or self.checkpoint_bytes < 0:
            raise SpecError("data_bytes and checkpoint_bytes: use a number of bytes >= 0")
        if self.checkpoint_every < 0:
            raise SpecError(f"checkpoint_every={self.checkpoint_every}: use 0 (never) or a number of steps")
        if self.checkpoint_mode not in CHECKPOINT_MODES:
            raise SpecError(f"checkpoint_mode={self.checkpoint_mode!r}: use one of {', '.join(CHECKPOINT_MODES)}")
        if not self.collective_timeout_s > 0:
            raise SpecError(f"collective_timeout_s={self.collective_timeout_s}: use a positive number of seconds")

    def checkpoint_due(self, step: int) -> bool:
        return self.checkpoint_every > 0 and self.checkpoint_bytes > 0 and step % self.checkpoint_every == 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobSpec:
        return cls(**{**d, "collective": CollectiveSpec(**d.get("collective", {}))})


@dataclass(frozen=True)
class RankHosts:
    """The storage hosts one rank talks to, by node name."""

    data: str
    checkpoint: str
    coordinator: str


def rank_name(rank: int) -> str:
    return f"rank{rank}"


def pair_connection_id(a: str, b: str, seed: int) -> int:
    """The connection id of nodes a and b (either way round), agreed without talking."""
    lo, hi = sorted((a, b))
    return zlib.crc32(f"fabriclab-training:{seed}:{lo}:{hi}".encode()) or 1
