"""`python -m transport COMMAND ...`: the transport's own entry point, how endpoints start in emulated hosts.

COMMAND is `srd recv|send` or `allreduce`, the same as under `fabriclab`, or `tcpflow recv|send`, the
sized-flow TCP baseline. The experiment runner and the live view start every endpoint this way
(`transport.command_line`). The parsers live in the `cli` package beside fabriclab's other commands, so
there is one argument-error parser and one set of argument types; its dispatcher loads only the module
of the command given, so a start imports the transport and its argument parsing and nothing of the
emulator or the experiments.
"""

import sys

from cli.main import main

TRANSPORT_COMMANDS = ("cli.srd", "cli.allreduce", "cli.tcpflow")

if __name__ == "__main__":
    sys.exit(main(modules=TRANSPORT_COMMANDS, prog="python -m transport",
                  description="The transport's commands: its UDP endpoints, the ring all-reduce worker and "
                  "sized TCP flows."))
