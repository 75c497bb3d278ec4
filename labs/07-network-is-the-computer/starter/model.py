"""Lab 7, your code: what the network costs a training step, in five formulas.

Copy this folder (`cp -r labs/07-network-is-the-computer/starter my-lab7`), fill in the TODOs, and
grade your copy with `fabriclab lab check 7 my-lab7`. The checker holds each formula to fabriclab's
simulated training job (transport/sim/trainsim.py), on the lab's fabric: 8 Mb/s host links, 4 Mb/s
uplinks, far storage behind a 2 Mb/s link.
"""

from __future__ import annotations


def prefetched_data_wait(data_s: float, compute_s: float, comm_s: float) -> float:
    """Seconds a step waits for its input when the read (`data_s` long) started as the previous step's
    compute did, so it ran under that compute (`compute_s`) and collective (`comm_s`)."""
    # TODO
    raise NotImplementedError("TODO: what is left of the read when the previous step is over")


def sync_checkpoint_stall(ranks: int, checkpoint_bytes: int, link_bps: float) -> float:
    """Seconds a synchronous checkpoint holds the job when `ranks` ranks each write `checkpoint_bytes`
    to far storage through one shared link of `link_bps` bit/s (the step goes on once every rank's
    write is in)."""
    # TODO
    raise NotImplementedError("TODO: every rank's bytes through the one link")


def async_checkpoint_stall(write_s: float, interval_s: float) -> float:
    """Seconds an asynchronous checkpoint holds the job when one write takes `write_s` and checkpoints
    are due every `interval_s` seconds: a checkpoint starts in the background at once, unless the
    previous write is still going, which it then waits for."""
    # TODO
    raise NotImplementedError("TODO: what the previous write has left when the next checkpoint is due")


def collision_probability(flows: int, uplinks: int) -> float:
    """The chance that ECMP, hashing each of `flows` flows onto one of `uplinks` equal uplinks at
    random, puts at least two of them on the same uplink (where they share its rate)."""
    # TODO: the birthday problem
    raise NotImplementedError("TODO: 1 - the chance that every flow gets an uplink of its own")


def steps_lost(failed_step: int, checkpoint_every: int) -> int:
    """Steps a job loses when the collective of step `failed_step` (steps count from 1) times out and
    it restarts from its last checkpoint, taken after every `checkpoint_every`-th step (synchronous:
    a checkpoint is written before the next step starts)."""
    # TODO
    raise NotImplementedError("TODO: the steps done since the last checkpoint")
