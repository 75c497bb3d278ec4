"""Arms of kind "training": a training job's ranks and storage hosts (transport/io/training.py), one
`train-node` process per host.

The experiment's `extra["training"]` lays the job out (`TrainingLayout`): the ranks' hosts in ring
order, each rank's near storage host, the far one, the coordinator's host and the job's settings. An
arm's labels pick where ranks read data and write checkpoints ("near" or "far") and may override the
job's settings (say {"checkpoint_mode": "async"}). Each rank is one of the arm's flows: from its host to
the storage host it checkpoints to, carrying its records for the analysis.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from emulator.errors import EmulatorError
from experiments.arms import base
from experiments.endpoints import command_line, sender_args
from experiments.model import Arm
from transport.core.headers import datagram_size_for_mtu
from transport.training.spec import rank_name

# `train-node` options the job's settings become (JobSpec's fields, as cli/training_node.py names them).
JOB_OPTIONS = {
    "steps": "--steps", "compute_s": "--compute-s", "collective": "--collective",
    "collective_bytes": "--collective-bytes", "data_bytes": "--data-bytes", "checkpoint_every": "--checkpoint-every",
    "checkpoint_bytes": "--checkpoint-bytes", "checkpoint_mode": "--checkpoint-mode",
    "collective_timeout_s": "--collective-timeout",
}
STORAGE_CHOICES = ("near", "far")


@dataclass(frozen=True)
class TrainingLayout:
    ranks: tuple[str, ...]  # hosts, in ring order
    near: dict[str, str]  # rank host -> its near storage host
    far: str
    coordinator: str
    job: dict[str, Any] = field(default_factory=dict)  # JOB_OPTIONS keys, plus "prefetch"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ranks": list(self.ranks)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainingLayout:
        return cls(tuple(d["ranks"]), dict(d["near"]), d["far"], d["coordinator"], dict(d.get("job", {})))

    def storage_hosts(self) -> list[str]:
        return sorted({*self.near.values(), self.far, self.coordinator})

    def placement(self, labels: dict[str, Any]) -> list[tuple[str, str, str]]:
        """(rank host, data host, checkpoint host) of every rank for an arm with these labels."""
        where = {k: labels.get(k, "near") for k in ("data_storage", "checkpoint_storage")}
        for k, v in where.items():
            if v not in STORAGE_CHOICES:
                raise ValueError(f"label {k}={v!r}: use one of {', '.join(STORAGE_CHOICES)}")

        def pick(rank: str, choice: str) -> str:
            return self.near[rank] if choice == "near" else self.far

        return [(h, pick(h, where["data_storage"]), pick(h, where["checkpoint_storage"])) for h in self.ranks]

    def job_args(self, labels: dict[str, Any]) -> list[str]:
        job = {**self.job, **{k: v for k, v in labels.items() if k in JOB_OPTIONS or k == "prefetch"}}
        out: list[str] = []
        for key, opt in JOB_OPTIONS.items():
            if key in job:
                out += [opt, str(job[key])]
        if "prefetch" in job:
            out.append("--prefetch" if job["prefetch"] else "--no-prefetch")
        return out


def node_commands(layout: TrainingLayout, arm_labels: dict[str, Any], ip: dict[str, str], common: list[str],
                  raw_dir: str) -> list[tuple[str, list[str]]]:
    """(host, command) of every node: storage hosts first (they must listen before ranks send), then ranks."""
    names = {h: rank_name(r) for r, h in enumerate(layout.ranks)}
    storage = layout.storage_hosts()
    nodes = ",".join([f"{names[h]}={ip[h]}" for h in layout.ranks] + [f"{h}={ip[h]}" for h in storage])
    shared = ["--nodes", nodes, "--coordinator", layout.coordinator, *layout.job_args(arm_labels), *common]
    cmds = [(h, command_line("train-node", "--name", h, *shared, "--json-out", f"{raw_dir}/trainnode-s-{h}.json"))
            for h in storage]
    for r, (h, data, ckpt) in enumerate(layout.placement(arm_labels)):
        cmds.append((h, command_line("train-node", "--name", names[h], "--data-host", data, "--checkpoint-host",
                                     ckpt, *shared, "--json-out", f"{raw_dir}/trainnode-{r}-{h}.json")))
    return cmds


class Training(base.ArmKind):
    name = "training"
    description = "training job over the transport, {policy} over {mode}, {recovery} recovery"
    reports_reordering = False
    min_wait_s = 120.0

    def describe(self, arm: Arm) -> str:
        labels = arm.labels
        mode = labels.get("checkpoint_mode", "sync")
        return (super().describe(arm) + f"; data from {labels.get('data_storage', 'near')} storage, {mode} "
                f"checkpoints to {labels.get('checkpoint_storage', 'near')} storage")

    def start(self, ctx: base.ArmContext) -> base.Procs:
        layout = TrainingLayout.from_dict(ctx.exp.extra["training"])
        arm = ctx.arm
        common = [*sender_args(arm.policy), "--recovery", arm.recovery, "--seed", str(ctx.seed),
                  "--mtu", str(datagram_size_for_mtu(ctx.topo.mtu))]
        hosts = (*layout.ranks, *layout.storage_hosts())
        if missing := [h for h in hosts if h not in {n.name for n in ctx.topo.hosts}]:
            raise EmulatorError(f"the training job's layout needs hosts {', '.join(missing)}, which this fabric "
                                "lacks; run it on its own topology")
        ip = {h: ctx.fab.ip(h) for h in hosts}
        storage, ranks = [], []
        ctx.t0 = time.monotonic()
        # A rank that speaks before its storage host listens is only retransmitted, never lost.
        for host, cmd in node_commands(layout, arm.labels, ip, common, str(ctx.raw_dir)):
            is_rank = cmd[cmd.index("--name") + 1].startswith("rank")
            (ranks if is_rank else storage).append(base.popen(ctx, host, cmd))
        return storage, ranks

    def traffic_starts(self, raw: dict[str, Any], t0: float) -> float:
        """The job starts at its first GO (ranks' clocks are the runner's: one machine, CLOCK_MONOTONIC)."""
        starts = [m["report"].get("started_at") for _, m in base.endpoint_files(raw, "trainnode-")
                  if isinstance(m.get("report"), dict)]
        starts = [s for s in starts if isinstance(s, (int, float))]
        return min(starts) if starts else t0

    def parse(self, raw: dict[str, Any], t0: float, n_bins: int) -> list[dict[str, Any]]:
        flows = []
        for name, m in base.endpoint_files(raw, "trainnode-"):
            report = m.get("report")
            if not isinstance(report, dict):
                continue  # a storage host
            _, idx, host = name.split("-", 2)
            transport = m.get("transport") or {}
            flows.append({
                "src": host, "dst": "", "index": int(idx), "bytes": 0,
                "goodput_bps": 0.0,
                "duration_s": report.get("wall_s"),
                "completed": m.get("error") is None and report.get("finished_at") is not None,
                "correct": report.get("mismatches") == 0,
                "retransmissions": transport.get("retransmissions", 0),
                "error": m.get("error"),
                "stop_reason": m.get("stop_reason"),
                "training": report,
                "series_bps": [],
            })
        return flows
