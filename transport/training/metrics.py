"""What a training job's records say: per-rank and job-wide step times, where the time went, goodput.

A rank's records (transport/training/rank.py) become plain dicts (`rank_report`), the same whether the
rank ran in the simulation or in an emulated host; `job_summary` combines the ranks' reports into the
figures results.json carries per arm. A job's step ends when its slowest rank's does, so the job's
step time is, for each attempt at a step, the longest of the ranks' times.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from transport.core.metrics import quantiles
from transport.training.rank import TrainingRank

PARTS = ("data_wait_s", "compute_s", "comm_s", "checkpoint_stall_s")


def rank_report(r: TrainingRank) -> dict[str, Any]:
    """One rank's records, transfers and rollbacks as plain data, with the job's setting."""
    wall = None
    if r.started_at is not None and r.finished_at is not None:
        wall = r.finished_at - r.started_at
    ckpts = [t.seconds for t in r.transfers if t.purpose == "checkpoint" and t.seconds is not None]
    return {
        "rank": r.rank,
        "phase": str(r.phase),
        "epoch": r.epoch,
        "steps": r.spec.steps,
        "started_at": r.started_at,
        "finished_at": r.finished_at,
        "wall_s": wall,
        "records": [asdict(rec) for rec in r.records],
        "rollbacks": [asdict(rb) for rb in r.rollbacks],
        "checkpoint_times_s": ckpts,
        "transfers": {p: sum(1 for t in r.transfers if t.purpose == p) for p in ("data", "checkpoint", "restore")},
        "stale_messages": r.stale_messages,
        "refused_messages": r.refused_messages,
        "mismatches": r.mismatches,
        "spec": r.spec.to_dict(),
    }


def _pct(values: list[float], q: float) -> float | None:
    found = quantiles(values, (q,), interpolate=False)
    return None if found is None else found[0]


def job_steps(reports: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The job's step attempts in order, each as its critical rank saw it.

    A step of the job starts when its last rank starts it (a rank that started early only waits for
    that one in the collective) and ends when its last rank ends it; its parts are those of the rank
    that started last. So a rank's wait in the next step's collective for a peer still checkpointing
    is not counted twice, as checkpoint stall and as communication, and the steps add up to the wall.
    """
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for rep in reports:
        for rec in rep.get("records", []):
            if rec.get("end") is not None:
                groups.setdefault((rec["epoch"], rec["step"]), []).append(rec)
    steps = []
    for (epoch, step), recs in groups.items():
        critical = max(recs, key=lambda r: r["start"])
        end = max(r["end"] for r in recs)
        outcome = next((r["outcome"] for r in recs if r["outcome"] != "done"), "done")
        flush = max(r.get("final_flush_s", 0.0) for r in recs)
        steps.append({**{p: critical[p] for p in PARTS}, "final_flush_s": flush,
                      "step": step, "epoch": epoch, "start": critical["start"], "seconds": end - critical["start"],
                      "outcome": outcome, "lost": any(r["lost"] for r in recs)})
    return sorted(steps, key=lambda s: (s["start"], s["epoch"], s["step"]))


def job_summary(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The job's figures from its ranks' reports (results.json's per-arm keys among them)."""
    steps = job_steps(reports)
    done = [s for s in steps if s["outcome"] == "done"]
    useful = [s for s in done if not s["lost"]]
    times = [s["seconds"] - s["final_flush_s"] for s in done]  # the job's end waiting for its last write is no step's
    starts = [r["started_at"] for r in reports if r.get("started_at") is not None]
    ends = [r["finished_at"] for r in reports if r.get("finished_at") is not None]
    finished = bool(reports) and len(ends) == len(reports)
    wall = (max(ends) - min(starts)) if finished and starts else None
    parts = {p: sum(s[p] for s in steps) for p in PARTS}
    useful_compute = sum(s["compute_s"] for s in useful)
    lost = max((sum(rb["steps_lost"] for rb in r.get("rollbacks", [])) for r in reports), default=0)
    rollbacks = max((len(r.get("rollbacks", [])) for r in reports), default=0)
    restore = [rb["resumed_at"] - rb["at"] for r in reports for rb in r.get("rollbacks", [])
               if rb.get("resumed_at") is not None]
    ckpt = [t for r in reports for t in r.get("checkpoint_times_s", [])]
    spec_steps = max((r.get("steps", 0) for r in reports), default=0)
    useful_steps = len({s["step"] for s in useful})
    return {
        "ranks": len(reports),
        "finished": finished,
        "steps": spec_steps,
        "useful_steps": useful_steps,
        "step_attempts": len(steps),
        "wall_s": wall,
        "step_time_p50_s": _pct(times, 50),
        "step_time_p99_s": _pct(times, 99),
        "step_time_mean_s": (sum(times) / len(times)) if times else None,
        "breakdown_s": parts,
        "compute_share": (useful_compute / wall) if wall else None,
        "checkpoint_stall_s": parts["checkpoint_stall_s"],
        "final_flush_s": max((s.get("final_flush_s", 0.0) for s in steps), default=0.0),
        "checkpoint_time_s": (sum(ckpt) / len(ckpt)) if ckpt else None,
        "checkpoints": len(ckpt) // max(1, len(reports)),
        "steps_lost": lost,
        "rollbacks": rollbacks,
        "restore_s": max(restore) if restore else None,
        "goodput_steps_per_s": (useful_steps / wall) if wall else None,
        "correct": all(r.get("mismatches", 0) == 0 for r in reports) and bool(reports),
        "timeline": steps,
    }
