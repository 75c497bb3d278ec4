"""Lab 4, your code: spot a broken path from per-path counters, and time how long a flow takes to recover.

Copy this folder (`cp -r labs/04-failover-path-aware/starter my-lab4`), fill in the two TODOs, and
grade your copy with `fabriclab lab check 4 my-lab4`. The checker feeds `paths_to_avoid` counters
measured in fabriclab's simulated network with a path dead, lossy, slow or healthy, and compares
`time_to_recover` with fabriclab's own on goodput series of simulated link failures.
"""

from __future__ import annotations

from collections.abc import Sequence


def paths_to_avoid(window: dict[int, dict]) -> set[int]:
    """The entropy values (EVs) a sprayed sender should stop using, judged from a recent window.

    `window` maps every EV the sender owns to what happened to the packets it sent on that EV
    during the last fraction of a second (the keys of the transport's own per-EV metrics):

    - `packets_sent`: packets sent on this EV in the window (first transmissions and retransmissions)
    - `acked`: of those, packets acknowledged
    - `losses`: packets the sender declared lost (a later packet was acknowledged first, or a timeout)
    - `timeouts`: retransmission timeouts that found packets of this EV still in flight
    - `rtt_p50`: median round-trip time measured on this EV so far, in seconds (None: no ACK yet)

    Every EV maps to one path through the fabric, and several EVs share a path. Return the set of
    EVs whose path looks broken: it loses a good share of what is sent on it, or its RTT is several
    times the best EV's.

    Things to think about (the checker tries each):
    - Healthy paths lose the odd packet and their RTTs differ by up to about 2x (queues).
    - A dead path sends no ACKs, so it has no new RTT samples: RTT alone cannot see it.
    - An EV that sent nothing in the window gives no evidence either way.
    - If most EVs look bad, the trouble is not one path (it is the sender's own link, or the
      receiver): steering cannot help, so avoid nothing.
    """
    # TODO: flag the EVs with a high loss share or an inflated RTT, following the notes above.
    raise NotImplementedError("TODO: decide which EVs to avoid from their counters")


def time_to_recover(times: Sequence[float], rates: Sequence[float], fault_t: float, baseline: float,
                    threshold: float = 0.9) -> float | None:
    """Seconds from the fault until a flow's goodput is back.

    `times[i]` is when sample `rates[i]` (bit/s) was taken; `baseline` is the rate the flow had
    before the fault at `fault_t`. The flow is back at the first sample taken at or after `fault_t`
    whose rate is at least `threshold * baseline` and whose next sample is too (a single good sample
    between bad ones is not a recovery; the last sample has no next one and counts on its own).
    Return that sample's time minus `fault_t`, or None if the flow never gets back.
    """
    # TODO: walk the samples from the fault on, as described above.
    raise NotImplementedError("TODO: find the first lasting sample at or above threshold * baseline")
