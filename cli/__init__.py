"""The `fabriclab` command line (cli.main) and its commands, one module per area.

Nothing is imported here: `python -m cli.endpoint` loads only cli.main, cli.args and the module of the
command it runs.
"""
