"""The core on a virtual clock: the in-memory simulated network, the simulated ring all-reduce, the path
policy trial and the transport benchmark."""
