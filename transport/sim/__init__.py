"""The core on a virtual clock: the in-memory simulated network and switched fabric, the simulated ring
all-reduce and collectives, the path policy trial and the transport benchmark."""
