"""Lab 7 checker: what the network costs a training step.

On a folder of code (your copy of starter/, holding model.py), each formula is held to fabriclab's
simulated training job (transport/sim/trainsim.py: the same ranks, storage hosts and transport as a
live run, on a virtual clock), on the lab's fabric (8 Mb/s host links, 4 Mb/s uplinks, far storage
behind 2 Mb/s):
- `sync_checkpoint_stall` against the stall of a synchronous checkpoint to far storage;
- `async_checkpoint_stall` against asynchronous checkpoints written more often than the far link
  can take them, and less often, and never negative or the whole write on cases drawn from the seed;
- `collision_probability` against ECMP-like hashing of flows onto uplinks, drawn many times;
- `steps_lost` against the steps a simulated job lost when a cut link timed a collective out, and on
  failures drawn from the seed the checker prints;
- `prefetched_data_wait` on a few cases.

On a results directory of `fabriclab run training` it grades every arm of the step that made it (step
2's four arms, or step 2b's cut; a run missing one fails): every job finished
with numpy's sums; far storage stalls synchronous checkpoints at least twice as long as near storage;
asynchronous checkpointing hides at least half of that; spraying's p99 step time no worse than ECMP's
(beyond noise); a cut link cost a rollback.
"""

from __future__ import annotations

import random
import zlib
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

from experiments.scenarios import training
from labs import grading
from labs.catalogue import LabError
from labs.grading import Check
from transport.core.config import TransportConfig
from transport.sim.trainsim import TrainFabric, TrainSimResult, train_simulated
from transport.training.collective import CollectiveSpec
from transport.training.spec import JobSpec

CODE = "model.py"
RANKS, CKPT_BYTES, FAR_BPS = 4, 128 * 1024, 2e6
FABRIC = {"host_rate_bps": 8e6, "uplink_rate_bps": 4e6, "storage_rate_bps": 8e6, "far_rate_bps": FAR_BPS,
          "far_delay": 0.0001, "queue_packets": 100}


@lru_cache(maxsize=16)
def _sim(checkpoint_every: int = 4, mode: str = "sync", steps: int = 8, cut: tuple | None = None) -> TrainSimResult:
    spec = JobSpec(steps=steps, compute_s=0.2, collective=CollectiveSpec(nbytes=64 * 1024), data_bytes=0,
                   checkpoint_every=checkpoint_every, checkpoint_bytes=CKPT_BYTES, checkpoint_mode=mode,
                   collective_timeout_s=5.0)
    r = train_simulated(spec, TrainFabric(**FABRIC, cut=cut), TransportConfig(mtu=8972), checkpoint_storage="far")
    if not r.completed:
        raise LabError("the simulated job did not finish; is the repository intact?")
    return r


def _number(name: str, got: Any, call: str) -> Check | None:
    if isinstance(got, (int, float)) and not isinstance(got, bool):
        return None
    return grading.failed(name, f"{call} returned {got!r:.60}, expected a number of seconds")


def _sync_write_s(r: TrainSimResult) -> float:
    """How long a synchronous checkpoint keeps the job: until the last rank's write is in, averaged over
    the checkpoints. Not the stall charged to a step, which is the last rank to start the step's: the
    far link serves the ranks' writes unevenly (0.6 s to 2.3 s of one checkpoint), so that rank's own
    write can be any of them."""
    per_rank = [rep.get("checkpoint_times_s", []) for rep in r.reports]
    rounds = list(zip(*per_rank, strict=False))
    return sum(max(times) for times in rounds) / len(rounds) if rounds else 0.0


def check_sync(mod: ModuleType) -> list[Check]:
    name = "sync_checkpoint_stall"
    got, err = grading.call(mod, name, RANKS, CKPT_BYTES, FAR_BPS)
    if err:
        return [err]
    call = f"{name}({RANKS}, {CKPT_BYTES}, {FAR_BPS:g})"
    if bad := _number(name, got, call):
        return [bad]
    measured = _sync_write_s(_sim())
    ratio = measured / got if got > 0 else None
    ok = ratio is not None and 0.9 <= ratio <= 1.3
    return [grading.holds(name, ok, f"{call} = {got:.2f} s; the simulated job's last write of a checkpoint was in "
                          f"after {measured:.2f} s ({ratio:.2f}x: the transport's headers and start-up on top)"
                          if ok else "",
                          f"{call} = {got:.4g} s; the simulated job's last write of a checkpoint was in after "
                          f"{measured:.2f} s (expected 0.9x to 1.3x your figure: every rank's bytes cross the one "
                          "far link)")]


def _stall_shape(name: str, got: float, write: float, call: str) -> Check | None:
    """A stall below zero, or longer than the write it waits for, is wrong whatever the simulation
    measured: a checkpoint never waits for more than the previous write."""
    if got < 0:
        return grading.failed(name, f"{call} = {got:.4g} s: a stall cannot be negative (a write that is done "
                              "before the next checkpoint is due holds it for 0 s)")
    if got > write + 1e-9:
        return grading.failed(name, f"{call} = {got:.4g} s, longer than the write itself ({write:.4g} s)")
    return None


def check_async(mod: ModuleType) -> list[Check]:
    name = "async_checkpoint_stall"
    write = _sync_write_s(_sim())
    checks = []
    for every, steps in ((1, 6), (4, 8)):
        s = _sim(every, "async", steps).summary
        interval = every * _sim(0).summary["step_time_p50_s"]
        got, err = grading.call(mod, name, write, interval)
        if err:
            return [err]
        call = f"{name}({write:.2f}, {interval:.2f})"
        if bad := _number(name, got, call) or _stall_shape(name, got, write, call):
            return [bad]
        # The first checkpoint has no previous write to wait for.
        measured = s["checkpoint_stall_s"] / max(1, s["checkpoints"] - 1)
        # The band is narrow enough to tell the stall from the whole write: every step, the simulated
        # job stalls 1.06x the write left over after the interval, and 0.74x the whole write.
        ok = measured <= 0.1 if got <= 0.05 else 0.85 * got <= measured <= 1.25 * got
        checks.append(grading.holds(
            f"{name}: a checkpoint every {every} step(s)", ok,
            f"{call} = {got:.2f} s; simulated {measured:.2f} s per checkpoint after the first",
            f"{call} = {got:.4g} s; the simulated job stalled {measured:.2f} s per checkpoint after the first "
            "(expected 0.85x to 1.25x your figure: a checkpoint waits only for what the previous write has "
            "left when it is due)"))
    # Writes and intervals drawn from this run's seed: the shape of the answer, not only two points.
    rng = grading.case_rng("lab7 async")
    for _ in range(4):
        w, i = round(rng.uniform(0.1, 5.0), 3), round(rng.uniform(0.1, 5.0), 3)
        got, err = grading.call(mod, name, w, i)
        if err:
            return [*checks, err]
        call = f"{name}({w}, {i})"
        if bad := _number(name, got, call) or _stall_shape(f"{name}: drawn cases", got, w, call):
            return [*checks, bad]
        if abs(got - max(0.0, w - i)) > 1e-6:
            return [*checks, grading.failed(f"{name}: drawn cases", f"{call} = {got:.4g} s; a write of {w} s "
                                            f"with the next checkpoint due {i} s later leaves "
                                            f"{max(0.0, w - i):.4g} s to wait")]
    checks.append(grading.passed(f"{name}: drawn cases", "never negative, never the whole write, the write "
                                 "left over when the next checkpoint is due, on 4 cases drawn from the seed"))
    return checks


def _hashed(flows: int, uplinks: int, trials: int = 20000) -> float:
    """How often flows with random source ports, hashed as a switch does, share an uplink."""
    rng = random.Random(7)
    shared = 0
    for _ in range(trials):
        picks = [zlib.crc32(rng.randbytes(8)) % uplinks for _ in range(flows)]
        shared += len(set(picks)) < flows
    return shared / trials


def check_collisions(mod: ModuleType) -> list[Check]:
    name = "collision_probability"
    for flows, uplinks in ((2, 2), (2, 4), (4, 8), (3, 2), (1, 4)):
        got, err = grading.call(mod, name, flows, uplinks)
        if err:
            return [err]
        want = _hashed(flows, uplinks)
        if not isinstance(got, (int, float)) or isinstance(got, bool) or abs(got - want) > 0.02:
            return [grading.failed(name, f"{name}({flows}, {uplinks}) = {got!r:.40}; hashing {flows} flows onto "
                                   f"{uplinks} uplinks 20000 times shared an uplink {want:.3f} of the time")]
    return [grading.passed(name, "agrees with hashed flows drawn 20000 times, for 1 to 4 flows on 2 to 8 uplinks "
                           f"(2 ring edges on 2 uplinks: {_hashed(2, 2):.2f})")]


def check_rollback(mod: ModuleType) -> list[Check]:
    name = "steps_lost"
    checks = []
    for cut in (("rank2", 2.0, 8.0), ("rank2", 6.3, 12.3)):
        r = _sim(4, "sync", 10, cut)
        rb = next((rep["rollbacks"][0] for rep in r.reports if rep["rollbacks"]), None)
        if rb is None:
            raise LabError("the simulated cut did not time a collective out; is the repository intact?")
        got, err = grading.call(mod, name, rb["failed_step"], 4)
        if err:
            return [err]
        call = f"{name}({rb['failed_step']}, 4)"
        checks.append(grading.holds(f"{name}: cut at {cut[1]:g} s", got == rb["steps_lost"],
                                    f"{call} = {got}, as the simulated job lost (it restarted from step "
                                    f"{rb['restart_from']})",
                                    f"{call} = {got!r:.40}; the simulated job lost {rb['steps_lost']} steps "
                                    f"(it restarted from the checkpoint of step {rb['restart_from']})"))
    # Two cuts are two numbers, easy to write down: more failures, drawn from this run's seed, counted the
    # way the job counts them (restart from the last checkpoint before the failed step: steps
    # 1 .. failed_step - 1 were done, and every `every`-th one was checkpointed).
    rng = grading.case_rng("lab7 steps lost")
    cases = {}
    for _ in range(6):
        every = rng.randint(2, 12)
        failed_step = rng.randint(1, 60)
        cases[f"step {failed_step} failed, a checkpoint every {every}"] = (failed_step, every)
    checks.append(grading.agrees(f"{name}: drawn cases", mod, name, cases,
                                 lambda failed_step, every: (failed_step - 1) % every,
                                 what="the steps done since the last checkpoint"))
    return checks


def check_prefetch(mod: ModuleType) -> list[Check]:
    cases = {"a read shorter than the step": (0.1, 0.2, 0.5),
             "a read longer than compute and collective": (1.0, 0.2, 0.5), "no compute": (0.3, 0.0, 0.1)}
    return [grading.agrees("prefetched_data_wait", mod, "prefetched_data_wait", cases,
                           lambda data, compute, comm: max(0.0, data - (compute + comm)), rel=1e-6,
                           what="the read left over after compute and collective")]


def check_code(target: Path) -> list[Check]:
    mod = grading.load_module(target, CODE)
    if isinstance(mod, Check):
        return [mod]
    return check_sync(mod) + check_async(mod) + check_collisions(mod) + check_rollback(mod) + check_prefetch(mod)


# ---- results directories ----------------------------------------------------------------------------


# The arms lab 7's steps run: step 2 the first four in one run, step 2b the cut in a run of its own.
MAIN_ARMS = (training.ECMP, training.SPRAY, training.FAR_SYNC, training.FAR_ASYNC)
CUT_ARMS = (training.CUT,)


def check_results(target: Path) -> list[Check]:
    doc = grading.load_results(target, training.NAME)
    names = {a["name"] for a in doc.get("arms", [])}
    # A run is graded on every arm of the step that made it, so a run of one easy arm is no pass.
    if training.CUT in names and not names & set(MAIN_ARMS):
        expected = CUT_ARMS
    else:
        expected = MAIN_ARMS + ((training.CUT,) if training.CUT in names else ())
    missing = [n for n in expected if n not in names]
    if missing:
        return [grading.failed("the run holds the lab's arms", f"{target} has {', '.join(sorted(names)) or 'no arms'}; "
                               f"missing {', '.join(missing)}: run step 2 (`--arms {','.join(MAIN_ARMS)}`) or "
                               f"step 2b (`--arms {training.CUT}`) as written")]
    t = (doc.get("analysis") or {}).get("training") or {}
    checks = []
    for name in expected:
        a = grading.arm(doc, name)
        s = t.get(name, {})
        checks.append(grading.holds(f"{name}: the job", bool(s.get("finished")) and a.get("correct") is True,
                                    f"{s.get('useful_steps')} steps, every collective equal to numpy's sum",
                                    "the job did not finish, or a collective differed from numpy's sum"))

    def stall(name: str) -> float | None:
        return grading.arm(doc, name).get("checkpoint_stall_s") if name in names else None

    if expected is not CUT_ARMS:
        near, far, far_async = stall(training.SPRAY), stall(training.FAR_SYNC), stall(training.FAR_ASYNC)
        checks.append(grading.at_least("far storage: the stall", far / near if near and far is not None else None,
                                       2.0, "far / near synchronous checkpoint stall"))
        checks.append(grading.at_most("asynchronous checkpoints",
                                      far_async / far if far and far_async is not None else None, 0.5,
                                      "asynchronous / synchronous stall to far storage"))
        e, s = (grading.arm(doc, n).get("step_time_p99_s") for n in (training.ECMP, training.SPRAY))
        checks.append(grading.at_most("spray against ECMP", s / e if s and e else None, 1.15,
                                      "spraying's / ECMP's p99 step time"))
    if training.CUT in names:
        cut = grading.arm(doc, training.CUT)
        rb, lost = cut.get("rollbacks"), cut.get("steps_lost")
        checks.append(grading.holds("the cut: a rollback", bool(rb) and isinstance(lost, int) and lost >= 0,
                                    f"{rb} rollback(s), {lost} steps lost",
                                    f"the cut link did not time a collective out ({rb!r} rollbacks, {lost!r} steps "
                                    "lost)"))
    return checks


def check(target: Path) -> list[Check]:
    return check_code(target) if grading.is_code_dir(target) else check_results(target)
