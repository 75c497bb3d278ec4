"""Lab 7, SOLUTION (the answer key): what the network costs a training step, in five formulas.

Copy the starter (`cp -r labs/07-network-is-the-computer/starter my-lab7`), not this file.
"""

from __future__ import annotations

import math


def prefetched_data_wait(data_s: float, compute_s: float, comm_s: float) -> float:
    """Seconds a step waits for its input when the read started with the previous step's compute."""
    return max(0.0, data_s - compute_s - comm_s)


def sync_checkpoint_stall(ranks: int, checkpoint_bytes: int, link_bps: float) -> float:
    """Seconds a synchronous checkpoint holds the step: every rank's bytes through one shared link."""
    return ranks * checkpoint_bytes * 8 / link_bps


def async_checkpoint_stall(write_s: float, interval_s: float) -> float:
    """Seconds an asynchronous checkpoint holds the step: only what the previous write has not done
    by the time the next checkpoint is due."""
    return max(0.0, write_s - interval_s)


def collision_probability(flows: int, uplinks: int) -> float:
    """The chance that ECMP's hashes put at least two of `flows` flows on one of `uplinks` uplinks."""
    if flows > uplinks:
        return 1.0
    apart = math.prod((uplinks - i) / uplinks for i in range(flows))
    return 1.0 - apart


def steps_lost(failed_step: int, checkpoint_every: int) -> int:
    """Steps done since the last checkpoint when step `failed_step`'s collective times out."""
    return (failed_step - 1) % checkpoint_every
