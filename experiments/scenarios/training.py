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
                   f"{s['steps_lost']} steps lost in {s['rollbacks']} rollbacks; "
                   f"{s['goodput_steps_per_s']:.2f} useful steps/s"
                   + ("." if s["correct"] else "; a collective's result differed from numpy's."))
    arms = arms_by_name(doc)
    have = lambda *names: all(n in t and t[n].get("finished") for n in names)  # noqa: E731
    if have(ECMP, SPRAY) and (r := _ratio(t[SPRAY]["step_time_p99_s"], t[ECMP]["step_time_p99_s"])):
        out.append(f"Spraying's p99 step time is {r:.2f}x ECMP's ({secs(t[SPRAY]['step_time_p99_s'])} against "
                   f"{secs(t[ECMP]['step_time_p99_s'])}): what hashing two ring edges onto one uplink costs a step.")
    if have(SPRAY, FAR_SYNC):
        extra = t[FAR_SYNC]["checkpoint_stall_s"] - t[SPRAY]["checkpoint_stall_s"]
        out.append(f"Checkpointing to far storage stalls the job {secs(extra)} more than near storage "
                   f"({secs(t[FAR_SYNC]['checkpoint_stall_s'])} against {secs(t[SPRAY]['checkpoint_stall_s'])}), "
                   f"{secs(t[FAR_SYNC]['checkpoint_time_s'])} per checkpoint.")
    if have(FAR_SYNC, FAR_ASYNC) and t[FAR_SYNC]["checkpoint_stall_s"]:
        hidden = 1 - t[FAR_ASYNC]["checkpoint_stall_s"] / t[FAR_SYNC]["checkpoint_stall_s"]
        out.append(f"Asynchronous checkpointing hides {hidden * 100:.0f} % of that stall (the target is 50 %); "
                   f"its last write holds the job's end {secs(t[FAR_ASYNC].get('final_flush_s'))}.")
    if have(LOSS_SR, LOSS_GBN) and (r := _ratio(t[LOSS_GBN]["step_time_p50_s"], t[LOSS_SR]["step_time_p50_s"])):
        gbn, sr = t[LOSS_GBN].get("retransmissions", 0), t[LOSS_SR].get("retransmissions", 0)
        out.append(f"Under 2 % loss, go-back-N's median step is {r:.2f}x selective repeat's, with "
                   f"{gbn} retransmissions against {sr}.")
    if have(SPRAY, CUT):
        c = t[CUT]
        lost_rate = _ratio(c["goodput_steps_per_s"], t[SPRAY]["goodput_steps_per_s"])
        out.append(f"The cut link timed a collective out: {c['rollbacks']} rollbacks cost {c['steps_lost']} steps "
                   f"and {secs(c.get('restore_s'))} to restore"
                   + (f"; the job's goodput fell to {lost_rate:.2f}x." if lost_rate is not None else "."))
    if not arms:
        out.append("No arm finished.")
    return out
