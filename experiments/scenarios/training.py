"""A training job's steps over the fabric: compute, a collective, data ingest and checkpoints to near
or far storage, with loss and a cut that cost a rollback; what the network costs the job."""

from __future__ import annotations

from typing import Any

from experiments.arms.training import TrainingLayout
from experiments.model import Arm, Experiment, Fault, Workload
from experiments.scenarios.common import arms_by_name, ok_arms, secs
from experiments.schema import ResultsDocument
from topologies import Topology
from transport.training.metrics import job_summary

NAME = "training"
SUMMARY = "a training job's step time, checkpoint stall and rollbacks: ECMP vs spray, near vs far storage"
ECMP, SPRAY = "ecmp", "spray"
FAR_SYNC, FAR_ASYNC = "spray-far-sync", "spray-far-async"
LOSS_SR, LOSS_GBN = "spray-loss2-sr", "spray-loss2-gbn"
CUT = "spray-cut"
ARMS = (ECMP, SPRAY, FAR_SYNC, FAR_ASYNC, LOSS_SR, LOSS_GBN, CUT)
# Results.json's per-arm keys (the rest of the job's summary is under analysis.training).
ARM_KEYS = ("step_time_p50_s", "step_time_p99_s", "compute_share", "checkpoint_stall_s", "steps_lost",
            "goodput_steps_per_s", "rollbacks", "checkpoint_time_s", "breakdown_s", "correct")

# Three leaves of three hosts, two spines; host links 8 Mb/s, leaf-spine links 4 Mb/s. Ranks h1, h4, h2,
# h5 in ring order: every ring edge crosses the spine, two per leaf and direction over two uplinks of
# 4 Mb/s, so ECMP's hashing decides whether a leaf's two edges share one. h3 and h6 are the ranks'
# near storage (same leaf); h7, on the third leaf behind a link shaped to FAR_MBPS, is the far site.
TOPOLOGY = "leaf-spine:spines=2,leaves=3,hosts=3,host_rate=8,fabric_rate=4"
FAR_HOST, FAR_LEAF, FAR_MBPS = "h7", "leaf3", 2.0
LAYOUT = TrainingLayout(
    ranks=("h1", "h4", "h2", "h5"), near={"h1": "h3", "h2": "h3", "h4": "h6", "h5": "h6"}, far=FAR_HOST,
    coordinator="h3",
    job={"steps": 12, "compute_s": 0.2, "collective": "allreduce", "collective_bytes": 128 * 1024,
         "data_bytes": 16 * 1024, "prefetch": True, "checkpoint_every": 4, "checkpoint_bytes": 128 * 1024,
         "checkpoint_mode": "sync", "collective_timeout_s": 4.0},
)


def build() -> Experiment:
    far = Fault(0.0, "rate", FAR_HOST, FAR_LEAF, FAR_MBPS)
    loss = Fault(0.0, "loss", "leaf1", "spine1", 2.0)
    cut = (Fault(5.0, "link_down", "h4", "leaf2"), Fault(10.0, "link_up", "h4", "leaf2"))

    def arm(name: str, mode: str = "spray", policy: str = "spray", faults: tuple[Fault, ...] = (),
            **labels: Any) -> Arm:
        return Arm(name, kind="training", mode=mode, policy=policy, faults=(far, *faults),
                   recovery=labels.pop("recovery", "selective"), labels=labels)

    pairs = tuple((h, LAYOUT.near[h]) for h in LAYOUT.ranks)
    return Experiment(
        name=NAME,
        title="A training job over the fabric: what ECMP, far storage, loss and a cut cost its steps",
        description="Four ranks step through data ingest (prefetched from near storage), 0.2 s of modelled "
        "compute, a ring all-reduce of the gradients checked bit for bit, and every 4 steps a checkpoint to "
        f"near storage (same leaf) or far storage (behind a {FAR_MBPS:g} Mb/s link standing for a private "
        "interconnect), synchronous or asynchronous. A collective that takes longer than its timeout fails "
        "the step and the job restarts from the last checkpoint every rank wrote.",
        topology=TOPOLOGY,
        arms=[
            arm(ECMP, mode="ecmp", policy="single"),
            arm(SPRAY),
            arm(FAR_SYNC, checkpoint_storage="far"),
            arm(FAR_ASYNC, checkpoint_storage="far", checkpoint_mode="async"),
            arm(LOSS_SR, faults=(loss,), loss_pct=2.0),
            arm(LOSS_GBN, faults=(loss,), loss_pct=2.0, recovery="gobackn"),
            arm(CUT, faults=cut),
        ],
        workload=Workload(pattern="pairs", pairs=pairs),
        duration_s=15.0,
        seed=1,
        extra={"training": LAYOUT.to_dict()},
    )


def analyse(doc: ResultsDocument, topo: Topology) -> dict[str, Any]:
    out = {}
    for a in ok_arms(doc["arms"]):
        reports = [f["training"] for f in a.get("flows", []) if isinstance(f.get("training"), dict)]
        if not reports:
            continue
        s = job_summary(reports)
        s["retransmissions"] = sum(f.get("retransmissions") or 0 for f in a.get("flows", []))
        a.update({k: s[k] for k in ARM_KEYS})
        a["job_wall_s"] = s["wall_s"]
        out[a["name"]] = s
    return {"training": out}


def _n(count: int, what: str) -> str:
    return f"{count} {what}" + ("" if count == 1 else "s")


def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x is not None and y else None


def sentences(doc: ResultsDocument) -> list[str]:
    t: dict[str, dict[str, Any]] = doc["analysis"].get("training", {})
    out = []
    for name, s in t.items():
        if not s.get("finished"):
            out.append(f"{name}: the job did not finish ({s.get('useful_steps', 0)} of {s.get('steps')} steps).")
            continue
        wall = f" ({secs(s['wall_s'])})" if s["wall_s"] else ""
        out.append(f"{name}: step time p50 {secs(s['step_time_p50_s'])}, p99 {secs(s['step_time_p99_s'])}; "
                   f"computing {s['compute_share'] * 100:.0f} % of the wall time{wall}; "
                   f"checkpoint stall {secs(s['checkpoint_stall_s'])}; "
                   f"{_n(s['steps_lost'], 'step')} lost in {_n(s['rollbacks'], 'rollback')}; "
                   f"{s['goodput_steps_per_s']:.2f} useful steps/s"
                   + ("." if s["correct"] else "; a collective's result differed from numpy's."))
    arms = arms_by_name(doc)
    have = lambda *names: all(n in t and t[n].get("finished") for n in names)  # noqa: E731
    if have(ECMP, SPRAY) and (r := _ratio(t[SPRAY]["step_time_p99_s"], t[ECMP]["step_time_p99_s"])):
        # A collision slows every step of the ring, not only the tail: the median says whether it happened.
        median = _ratio(t[SPRAY]["step_time_p50_s"], t[ECMP]["step_time_p50_s"])
        why = ("ECMP hashed ring edges of a leaf onto one uplink, which slowed every step" if median and median < 0.85
               else "ECMP's hashes kept the ring edges apart this time (two edges of a leaf meet on one of two "
               "uplinks with even odds), so the median steps are alike")
        out.append(f"Spraying's p99 step time is {r:.2f}x ECMP's ({secs(t[SPRAY]['step_time_p99_s'])} against "
                   f"{secs(t[ECMP]['step_time_p99_s'])}): {why}.")
    if have(SPRAY, FAR_SYNC):
        extra = t[FAR_SYNC]["checkpoint_stall_s"] - t[SPRAY]["checkpoint_stall_s"]
        out.append(f"Checkpointing to far storage stalls the job {secs(extra)} more than near storage "
                   f"({secs(t[FAR_SYNC]['checkpoint_stall_s'])} against {secs(t[SPRAY]['checkpoint_stall_s'])}), "
                   f"{secs(t[FAR_SYNC]['checkpoint_time_s'])} per checkpoint.")
    if have(FAR_SYNC, FAR_ASYNC) and t[FAR_SYNC]["checkpoint_stall_s"]:
        sync, stall, flush = t[FAR_SYNC]["checkpoint_stall_s"], t[FAR_ASYNC]["checkpoint_stall_s"], \
            t[FAR_ASYNC].get("final_flush_s") or 0.0
        out.append(f"Asynchronous checkpointing hides {(1 - stall / sync) * 100:.0f} % of that stall "
                   f"while the job runs; its last write holds the job's end {secs(flush)}, and counting that, it hides "
                   f"{(1 - (stall + flush) / sync) * 100:.0f} %.")
    if have(LOSS_SR, LOSS_GBN) and (r := _ratio(t[LOSS_GBN]["step_time_p50_s"], t[LOSS_SR]["step_time_p50_s"])):
        gbn, sr = t[LOSS_GBN].get("retransmissions", 0), t[LOSS_SR].get("retransmissions", 0)
        out.append(f"Under 2 % loss, go-back-N's median step is {r:.2f}x selective repeat's, with "
                   f"{gbn} retransmissions against {sr}.")
    if have(SPRAY, CUT):
        c = t[CUT]
        lost_rate = _ratio(c["goodput_steps_per_s"], t[SPRAY]["goodput_steps_per_s"])
        fell = f"; the job's goodput fell to {lost_rate:.2f}x." if lost_rate is not None else "."
        if c["rollbacks"]:
            out.append(f"The cut link timed a collective out: {_n(c['rollbacks'], 'rollback')} cost "
                       f"{_n(c['steps_lost'], 'step')} and {secs(c.get('restore_s'))} to restore" + fell)
        else:  # a cut shorter than the collective's timeout (e.g. a shorter --duration) only stalls steps
            out.append(f"The cut link stalled steps (p99 {secs(c['step_time_p99_s'])}) but timed no collective "
                       "out, so nothing rolled back" + fell)
    if not arms:
        out.append("No arm finished.")
    return out


# --------------------------------------------------------------------------------------------------
# The same arms on the virtual clock (transport/sim/trainsim.py), without root: what the model predicts


def simulated_arm(exp: Experiment, arm: Arm, seed: int | None = None) -> dict[str, Any]:
    """Run one arm's job on the simulated fabric shaped like the default one; the job's summary.

    The simulated fabric has the same rates, ranks per leaf (interleaved in ring order, as the ranks'
    hosts are) and storage; faults map onto it: loss on a leaf-spine link (the simulation puts it on
    leaf 0's first uplink), a cut rank access link (its down interval, counted from the job's start),
    the far host's rate. Its packets cross store-and-forward queues with no CPU in the way.
    """
    from transport.core.config import TransportConfig
    from transport.sim.trainsim import TrainFabric, train_simulated
    from transport.training.collective import CollectiveSpec
    from transport.training.spec import JobSpec, rank_name

    layout = TrainingLayout.from_dict(exp.extra["training"])
    topo_rates = dict(p.split("=") for p in exp.topology.split(":", 1)[1].split(","))
    job = {**layout.job, **{k: v for k, v in arm.labels.items() if k in layout.job}}
    spec = JobSpec(steps=job["steps"], compute_s=job["compute_s"],
                   collective=CollectiveSpec(job["collective"], job["collective_bytes"]), data_bytes=job["data_bytes"],
                   prefetch=job["prefetch"], checkpoint_every=job["checkpoint_every"],
                   checkpoint_bytes=job["checkpoint_bytes"], checkpoint_mode=job["checkpoint_mode"],
                   collective_timeout_s=job["collective_timeout_s"])
    host = float(topo_rates["host_rate"]) * 1e6
    fab = TrainFabric(leaves=2, ranks_per_leaf=len(layout.ranks) // 2, spines=int(topo_rates["spines"]),
                      host_rate_bps=host, uplink_rate_bps=float(topo_rates["fabric_rate"]) * 1e6,
                      storage_rate_bps=host, far_rate_bps=host, far_delay=0.0001, queue_packets=100)
    down: dict[str, float] = {}
    for f in arm.faults:
        if f.kind == "rate" and layout.far in (f.a, f.b):
            fab.far_rate_bps = f.value * 1e6
        elif f.kind == "loss":
            fab.loss = f.value / 100
        elif f.kind == "link_down":
            down[f.a] = f.at_s
        elif f.kind == "link_up" and f.a in down:
            fab.cut = (rank_name(layout.ranks.index(f.a)), down.pop(f.a), f.at_s)
    config = TransportConfig(path_policy=arm.policy, recovery=arm.recovery, mtu=8972)
    r = train_simulated(spec, fab, config, data_storage=arm.labels.get("data_storage", "near"),
                        checkpoint_storage=arm.labels.get("checkpoint_storage", "near"),
                        seed=exp.seed if seed is None else seed)
    return {**r.summary, "retransmissions": r.transport["retransmissions"], "simulated_s": r.duration}


def simulate(seed: int | None = None, arms: tuple[str, ...] = ARMS) -> dict[str, Any]:
    """Every arm on the virtual clock, and the doc-shaped result the sentences read."""
    exp = build()
    return {"analysis": {"training": {a.name: simulated_arm(exp, a, seed) for a in exp.arms if a.name in arms}},
            "arms": []}
