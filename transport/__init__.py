"""The SRD-like transport: the sans-I/O core (transport.core), its UDP endpoints (transport.io), the
core on a virtual clock (transport.sim) and the collectives (transport.collective).

Endpoints in emulated hosts start as `python -m cli.endpoint COMMAND` (cli/endpoint.py): the command
line sits above the transport, which imports nothing of it.
"""
