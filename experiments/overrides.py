"""The command line's overrides of an experiment: another fabric, duration, seed, repetitions, or only
some of its arms. Fault times, an all-reduce's array and a training job's steps scale with the duration."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from experiments.model import Experiment, Workload

# The smallest all-reduce a shortened run still makes: one 64 KiB piece per rank.
MIN_COLLECTIVE_ELEMENTS = 16 * 1024


def _scaled_collective(w: Workload, scale: float) -> Workload:
    """An all-reduce is sized in elements, not seconds: a shorter or longer run scales the array, so
    `--duration` means the same thing (about how long the traffic lasts) for every experiment."""
    if not w.elements:
        return w
    elements = max(MIN_COLLECTIVE_ELEMENTS, round(w.elements * scale / 1024) * 1024)
    return replace(w, elements=elements)


def _scaled_training(extra: dict, scale: float) -> dict:
    """A training job is sized in steps: a shorter or longer run scales them, keeping one checkpoint."""
    job = (extra.get("training") or {}).get("job") or {}
    if "steps" not in job:
        return extra
    steps = max(job.get("checkpoint_every") or 1, round(job["steps"] * scale))
    return {**extra, "training": {**extra["training"], "job": {**job, "steps": steps}}}


class ArmNotFound(LookupError):
    """--arms named an arm the experiment does not have."""


def with_overrides(exp: Experiment, topology: str | None = None, duration: float | None = None,
                   seed: int | None = None, repetitions: int | None = None,
                   arms: Sequence[str] | None = None) -> Experiment:
    """A copy of `exp` with the command line's overrides (fault times and all-reduce arrays, the
    experiment's and an arm's own, scale with the duration; `arms` keeps only the arms named, in the
    experiment's own order)."""
    if arms:
        unknown = [a for a in arms if a not in {x.name for x in exp.arms}]
        if unknown:
            raise ArmNotFound(f"{exp.name} has no arm {', '.join(repr(u) for u in unknown)}; its arms are "
                              f"{', '.join(a.name for a in exp.arms)}")
        exp = replace(exp, arms=[a for a in exp.arms if a.name in arms])
    if duration is not None and duration != exp.duration_s:
        scale = duration / exp.duration_s
        exp = replace(exp, arms=[replace(a, faults=tuple(replace(f, at_s=f.at_s * scale) if f.at_s > 0 else f
                                                         for f in a.faults),
                                         workload=a.workload and _scaled_collective(a.workload, scale))
                                 for a in exp.arms],
                      duration_s=duration, workload=_scaled_collective(exp.workload, scale),
                      extra=_scaled_training(exp.extra, scale))
    if topology:
        exp = replace(exp, topology=topology)
    if seed is not None:
        exp = replace(exp, seed=seed)
    if repetitions:
        exp = replace(exp, repetitions=repetitions)
    return exp
