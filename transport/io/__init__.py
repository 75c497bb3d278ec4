"""The UDP endpoints around the core: the event loop, the srd sender and receiver, the all-reduce and
collective workers, their addressing and workloads, and the sized TCP flows of the baseline."""
