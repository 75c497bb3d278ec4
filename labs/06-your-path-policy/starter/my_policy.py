"""Lab 6: your own path policy. Fill in the TODOs; the lab's README says what each method is for.

The transport builds one policy per connection as MyPolicy(num_evs, rng) and then, for every packet
it sends, asks next_ev() which entropy value (EV, 0..num_evs-1) to put it on; the EV becomes the UDP
source port, so it picks the packet's path. It tells the policy what happened on each EV: on_ack()
with the round-trip time, on_loss() when a packet on it was declared lost, on_timeout() when the
retransmission timer fired for it. `now` is the time in seconds (simulated or real). Look at the
built-in policies in transport/core/paths.py (SinglePath, Spray, Adaptive) for examples.

Grade it:            fabriclab lab check 6 DIR   (DIR: the folder holding this file)
Run it on a fabric:  fabriclab run hot-link --path-policy DIR/my_policy.py:MyPolicy --duration 8
"""

from __future__ import annotations

import random


class MyPolicy:
    def __init__(self, num_evs: int, rng: random.Random) -> None:
        self.num_evs = num_evs
        # TODO: the state your policy keeps, e.g. a round-robin position (start it at
        # rng.randrange(num_evs), as Spray does), and per EV: a smoothed RTT, until when it rests.

    def next_ev(self, now: float, avoid: int | None = None) -> int:
        # TODO: return the EV (an int from 0 to num_evs - 1) for the next packet. Spread packets
        # over the EVs, skip the ones that misbehaved recently, and do not return `avoid` (the EV a
        # retransmitted packet was lost on) unless there is no other.
        raise NotImplementedError("TODO: choose an EV in 0..num_evs-1")

    def on_ack(self, ev: int, rtt: float, now: float) -> None:
        # TODO: a packet sent on `ev` was acknowledged after `rtt` seconds. Is this EV's path queueing
        # (its RTT far above the other EVs')?
        pass

    def on_loss(self, ev: int, now: float) -> None:
        # TODO: a packet sent on `ev` was lost.
        pass

    def on_timeout(self, ev: int, now: float) -> None:
        # TODO: the retransmission timer fired for a packet sent on `ev`: maybe its path is cut.
        pass

    def state(self) -> dict:
        # TODO (optional): numbers worth seeing in the metrics (JSON values only), e.g. rests per EV.
        return {}
