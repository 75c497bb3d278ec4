"""Collectives over the transport, sans-I/O like the core, each as a state table that the UDP workers
(transport/io/allreduce.py, transport/io/collective.py) and the simulations (transport/sim/ringsim.py,
transport/sim/collsim.py) drive alike.

* ring.py: the ring all-reduce (`RingWorker`, `RingRank`), the original and `fabriclab allreduce`'s default;
* plan.py: every collective as a plan of transfers (all-reduce, reduce-scatter, all-gather, all-to-all,
  hierarchical all-reduce), its schedule tabled at the top; worker.py runs one rank's part of a plan;
* base.py: what they share (header, inputs, chunks, comparison) and a measured run's phases (`RankRun`);
* api.py: the objects a driver holds; report.py: bounds, busbw and nccl-tests' table.

The API for a workload (a training step's gradient all-reduce or MoE all-to-all)::

    from transport.collective import collective

    c = collective("all-reduce", rank, peers, nbytes)   # or "reduce-scatter", "all-gather",
                                                        # "all-to-all", "hierarchical" (group=L)
    for msg in c.start(now):          # begins the next operation (``operations=K`` of them, default 1)
        send(peers[msg.dst], msg.data)
    ... on every message addressed to this rank, from any peer:
    for msg in c.receive(data, now):
        send(peers[msg.dst], msg.data)
    c.done                            # the operation is over on this rank; c.op_times[-1] its duration

``peers`` lists every rank in rank order (whatever the driver addresses them by); every rank must be
given the same name, peers, nbytes, group, operations, seed and piece_bytes. Messages of a rank's next
operation may arrive before it calls ``start`` again: they are kept. Give each ordered pair
(``c.rank``, ``d``) for d in ``c.sends_to`` its own reliable channel, e.g. the Connections of
``api.pair_connections`` (messages may arrive in any order, duplicated or not). ``start`` while an
operation runs, or after the last, raises `CollectiveStateError`; a message that is not this
collective's raises `RingProtocolError`. `transport.sim.collsim.SimCollectiveGroup(colls, fabric)`
runs a job's Collectives over the simulated transport, ``run_operation(now)`` one operation at a time.
``check=True`` (the default) compares every result bit for bit with numpy's (``c.correct``,
``c.mismatch``); the inputs are integer-valued floats (`plan.make_int_input`), so any order of
additions gives numpy's sums exactly. ``report.bound`` gives the operation's time bound, ``report.Row``
its algbw and busbw.
"""

from transport.collective.api import Collective, CollectiveStateError, collective, pair_connections
from transport.collective.base import RingProtocolError
from transport.collective.plan import COLLECTIVES
from transport.collective.worker import Message

__all__ = ["COLLECTIVES", "Collective", "CollectiveStateError", "Message", "RingProtocolError", "collective",
           "pair_connections"]
