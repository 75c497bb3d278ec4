"""The engines an experiment runs on, named for `--engine` and its help.

An experiment (topology, workload, arms, faults, analysis) knows no engine; an engine turns each arm
into the raw record experiments.results reads (experiments.schema.RawArm): the live emulator
(experiments.runner.run_arm: Mininet, Open vSwitch, the controller and the transport's endpoints as
processes) or the simulated engine (experiments.sim_arm: the same transport core and the controller's
own flow entries on a virtual clock).
"""

from __future__ import annotations

from experiments.model import Arm, Experiment

ENGINES = {
    "live": "the emulator: real namespaces, Open vSwitch, the controller and the transport's UDP endpoints "
            "(needs root; rates of a few Mb/s on a small machine)",
    "sim": "the simulated engine: the same transport core and the controller's own flow entries on a virtual "
           "clock (no root; any fabric size and rate, e.g. 100 Gb/s; the transport's own arms only)",
}
DEFAULT = "live"


def help_text() -> str:
    return "; ".join(f"{name}: {what}" for name, what in ENGINES.items())


def runnable_arms(exp: Experiment, engine: str) -> tuple[list[Arm], list[Arm]]:
    """(the arms `engine` runs, the arms it leaves out) of `exp`."""
    if engine != "sim":
        return list(exp.arms), []
    from experiments.sim_arm import SimUnsupported, check_arm

    keep, left = [], []
    for arm in exp.arms:
        try:
            check_arm(arm, arm.workload or exp.workload)
            keep.append(arm)
        except SimUnsupported:
            left.append(arm)
    return keep, left
