"""`python -m cli.endpoint COMMAND ...`: how the transport's endpoints start in emulated hosts.

COMMAND is `srd recv|send`, `allreduce` or `train-node`, the same as under `fabriclab`, or `tcpflow
recv|send`, the sized-flow TCP baseline. The experiment runner and the live view start every endpoint this way
(`experiments.endpoints.command_line`). The parsers are fabriclab's own command modules, so there is one
argument-error parser and one set of argument types; the dispatcher loads only the module of the
command given, so a start imports the transport and its argument parsing and nothing of the emulator
or the experiments. The entry point lives here, above the transport, so that the transport imports
nothing of the command line.
"""

import os
import sys

# An endpoint uses numpy only for its final metrics: one BLAS thread, not one per core that spins after
# each call (an endpoint's preload cost 0.27 CPU seconds with the spinning thread, 0.13 without, and
# the spin ran on into the traffic window).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from cli.main import main  # noqa: E402  (after the thread limits, which numpy reads when it loads)

TRANSPORT_COMMANDS = ("cli.srd", "cli.allreduce", "cli.tcpflow", "cli.training_node")
PROG = "python -m cli.endpoint"

if __name__ == "__main__":
    sys.exit(main(modules=TRANSPORT_COMMANDS, prog=PROG,
                  description="The transport's commands: its UDP endpoints, the ring all-reduce worker, a "
                  "training job's nodes and sized TCP flows."))
