"""The sans-I/O protocol core: wire format, configuration, connection, loss recovery, congestion control,
path policies, reassembly, events and metrics. Nothing here reads a clock or touches a socket."""
