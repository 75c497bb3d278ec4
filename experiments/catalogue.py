"""The experiments fabriclab ships, by name: one module each under experiments/scenarios, listed in
SCENARIOS. A module gives NAME, SUMMARY (a line for `fabriclab list`), `build()` (the Experiment),
`analyse(doc, topo)` (what its analysis adds to results.json) and `sentences(doc)` (its summary's
sentences, computed from the measured numbers). Adding an experiment is one new module there plus its
line in SCENARIOS.

Default topologies and rates are sized for two CPU cores: the transport's endpoints are Python
processes and userspace Open vSwitch forwards every packet in software, so rates are a few Mb/s per
host and the fabrics small enough that the emulated links, not the CPU, limit the traffic (each run
records CPU idle and says when that did not hold).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from experiments.model import Experiment
from experiments.schema import ResultsDocument
from topologies import Topology

# The registry: one line per experiment, in the order `fabriclab list` shows them.
SCENARIOS = (
    "experiments.scenarios.ecmp_vs_spray",
    "experiments.scenarios.loss_recovery",
    "experiments.scenarios.reordering",
    "experiments.scenarios.hot_link",
    "experiments.scenarios.failover",
    "experiments.scenarios.in_server",
    "experiments.scenarios.allreduce",
    "experiments.scenarios.training",
    "experiments.scenarios.incast",
    "experiments.scenarios.hierarchical",
)


@dataclass(frozen=True)
class Entry:
    name: str
    summary: str
    build: Callable[[], Experiment]
    analyse: Callable[[ResultsDocument, Topology], dict[str, Any]]
    sentences: Callable[[ResultsDocument], list[str]]
    # Its analysis reads every repetition of a repeated run (medians), rather than the last one's arms.
    across_repetitions: bool = False


CATALOGUE: dict[str, Entry] = {}


def register(module: ModuleType) -> Entry:
    """Add an experiment module (NAME, SUMMARY, build, analyse, sentences; optionally ACROSS_REPETITIONS)
    to the catalogue."""
    entry = Entry(module.NAME, module.SUMMARY, module.build, module.analyse, module.sentences,
                  getattr(module, "ACROSS_REPETITIONS", False))
    CATALOGUE[entry.name] = entry
    return entry


def get(name: str) -> Entry:
    try:
        return CATALOGUE[name]
    except KeyError:
        raise KeyError(name) from None


for _name in SCENARIOS:
    register(importlib.import_module(_name))
