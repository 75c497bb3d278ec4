"""Collectives over the transport, sans-I/O like the core: the ring all-reduce's schedule and state table,
driven by the UDP worker (transport.io.allreduce) and by the simulation (transport.sim.ringsim)."""
