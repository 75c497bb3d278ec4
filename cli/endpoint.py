"""`python -m cli.endpoint COMMAND ...`: how the transport's endpoints start in emulated hosts.

COMMAND is `srd recv|send`, `allreduce` or `train-node`, the same as under `fabriclab`, or `tcpflow
recv|send`, the sized-flow TCP baseline. The experiment runner and the live view start every endpoint this way
(`experiments.endpoints.command_line`). The parsers are fabriclab's own command modules, so there is one
argument-error parser and one set of argument types; the dispatcher loads only the module of the
command given, so a start imports the transport and its argument parsing and nothing of the emulator
or the experiments. The entry point lives here, above the transport, so that the transport imports
nothing of the command line.
"""

import sys

from cli.main import main

TRANSPORT_COMMANDS = ("cli.srd", "cli.allreduce", "cli.tcpflow", "cli.training_node")
PROG = "python -m cli.endpoint"

if __name__ == "__main__":
    sys.exit(main(modules=TRANSPORT_COMMANDS, prog=PROG,
                  description="The transport's commands: its UDP endpoints, the ring all-reduce worker, a "
                  "training job's nodes and sized TCP flows."))
