"""PNG plots of a results document (matplotlib, Agg backend): link utilisation heatmaps, completion-time
CDFs, goodput vs loss, reorder-distance histograms, per-path share, goodput over time, and a training
job's per-step timeline and step-time CDF.

Each function returns the file names it wrote (relative to the output directory); a plot that has
no data in this experiment is skipped.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from experiments import records
from experiments.analysis import links
from experiments.schema import ArmResult, ResultsDocument, arm_label

log = logging.getLogger(__name__)


def _ok(doc: ResultsDocument) -> list[ArmResult]:
    return [a for a in doc["arms"] if not a.get("error")]


def _save(fig: Any, out_dir: Path, name: str) -> str:
    # Rendered in memory and written by rename: a symlink planted at the plot's path is replaced, and
    # whatever it points to is never written.
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    records.atomic_write(out_dir / name, buf.getvalue())
    return name


def tier_order(labels: list[str], roles: dict[str, str]) -> tuple[list[str], list[tuple[int, str]]]:
    """Link directions ("a->b") grouped by the tiers they join, upward ones first, lowest tier first;
    and where each group starts with its name ("edge->agg")."""
    from topologies.model import ROLE_TIER

    def tiers(label: str) -> tuple[int, int]:
        a, _, b = label.partition("->")
        return ROLE_TIER.get(roles.get(a, ""), 0), ROLE_TIER.get(roles.get(b, ""), 0)

    def key(label: str) -> tuple[int, int, str]:
        ta, tb = tiers(label)
        return (0 if tb > ta else 1, ta if tb > ta else -ta, label)

    ordered = sorted(labels, key=key)
    groups: list[tuple[int, str]] = []
    for i, label in enumerate(ordered):
        a, _, b = label.partition("->")
        name = f"{roles.get(a, '?')}->{roles.get(b, '?')}"
        if not groups or groups[-1][1] != name:
            groups.append((i, name))
    return ordered, groups


LABELLED_ROWS = 96


def utilisation_heatmaps(doc: ResultsDocument, out_dir: Path) -> list[str]:
    arms = [a for a in _ok(doc) if a.get("link_series", {}).get("fabric")]
    if not arms:
        return []
    rows = len(arms[0]["link_series"]["fabric"])
    # A row per link direction, named, up to LABELLED_ROWS; a bigger fabric (a k=16 fat-tree has 4,096)
    # gets a panel of fixed height with its tiers named: thousands of named rows took minutes to draw.
    per_arm = 0.28 * rows if rows <= LABELLED_ROWS else 0.28 * LABELLED_ROWS
    fig, axes = plt.subplots(len(arms), 1, figsize=(9, 1.2 + per_arm * len(arms)), squeeze=False)
    roles = {n["name"]: n.get("role", "") for n in (doc.get("topology", {}).get("fabric") or {}).get("nodes", [])}
    for ax, a in zip(axes[:, 0], arms, strict=True):
        ls = a["link_series"]
        names, groups = tier_order(ls["fabric"], roles)
        data = np.array([ls["util"][n] for n in names])
        t = ls["t"]
        extent = (t[0], t[-1] if len(t) > 1 else t[0] + 0.5, len(names) - 0.5, -0.5)
        im = ax.imshow(data, aspect="auto", cmap="viridis", vmin=0, vmax=1.0, extent=extent, interpolation="nearest")
        if len(names) <= LABELLED_ROWS:
            ax.set_yticks(range(len(names)), names, fontsize=7)
        else:
            ax.set_yticks([])
            ax.set_ylabel(f"{len(names):,} link directions", fontsize=8)
        if len(groups) > 1:  # separate the tiers (edge->agg, agg->core, ...) with a line and a label
            for start, label in groups:
                if start:
                    ax.axhline(start - 0.5, color="white", linewidth=1.2)
                ax.text(1.0, start - 0.4, label, transform=ax.get_yaxis_transform(), fontsize=7, ha="right",
                        va="top", color="white")
        ax.set_title(f"{arm_label(a)}: fabric link utilisation", fontsize=9)
        ax.set_xlabel("time since traffic start (s)", fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.03, pad=0.01)
    return [_save(fig, out_dir, "link_utilisation.png")]


def _cdfs(doc: ResultsDocument, series: dict[str, list[float]], xlabel: str, what: str, out_dir: Path,
          name: str) -> list[str]:
    """One step CDF per labelled series of values (none drawn: no file)."""
    series = {label: sorted(v) for label, v in series.items() if v}
    if not series:
        return []
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, vals in series.items():
        ax.step(vals, np.arange(1, len(vals) + 1) / len(vals), where="post", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("CDF")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{doc['experiment']}: {what}", fontsize=10)
    return [_save(fig, out_dir, name)]


def completion_cdfs(doc: ResultsDocument, out_dir: Path) -> list[str]:
    series = {}
    for a in _ok(doc):
        if a.get("kind") == "training":
            continue  # a rank's wall time is no completion time: its steps have their own CDF
        if a.get("completion_kind") == "message":
            series[a["name"]] = [f["message_p50_s"] for f in a["flows"] if f.get("message_p50_s")]
        else:
            series[a["name"]] = [f["duration_s"] for f in a["flows"] if f.get("duration_s")]
    kind = "flow" if any(a.get("completion_kind") == "flow" for a in _ok(doc)) else "message (per-flow median)"
    return _cdfs(doc, series, f"{kind} completion time (s)", "completion times", out_dir, "completion_cdf.png")


def goodput_vs_loss(doc: ResultsDocument, out_dir: Path) -> list[str]:
    groups: dict[str, list[tuple[float, float]]] = {}
    for a in _ok(doc):
        loss = a.get("labels", {}).get("loss_pct")
        if loss is None:
            continue
        key = a["labels"].get("recovery") or a["name"].split("@")[0]
        groups.setdefault(key, []).append((loss, a["goodput_bps"] / 1e6))
    if not groups or all(len(v) < 2 for v in groups.values()):
        return []
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, pts in sorted(groups.items()):
        pts.sort()
        xs = [max(p[0], 0.01) for p in pts]
        ax.plot(xs, [p[1] for p in pts], marker="o", label=key)
    ax.set_xscale("log")
    ax.set_xlabel("random loss on the fabric link (%; 0 shown at 0.01)")
    ax.set_ylabel("goodput (Mb/s)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(f"{doc['experiment']}: goodput vs loss", fontsize=10)
    return [_save(fig, out_dir, "goodput_vs_loss.png")]


def distance_bins(labels: Iterable[str]) -> list[str]:
    """Reorder-distance bin labels ("1", "2-3", ..., "1024+") once each, smallest distance first: the
    endpoints' JSON stores them sorted as text, which would put "1024+" second."""
    return sorted(set(labels), key=lambda label: int(label.split("-")[0].rstrip("+")))


def reorder_histograms(doc: ResultsDocument, out_dir: Path) -> list[str]:
    arms = [a for a in _ok(doc) if (a.get("reorder") or {}).get("distance_histogram")]
    if not arms:
        return []
    labels = distance_bins(k for a in arms for k in a["reorder"]["distance_histogram"])
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(arms)
    x = np.arange(len(labels))
    for i, a in enumerate(arms):
        h = a["reorder"]["distance_histogram"]
        ax.bar(x + i * width, [h.get(k, 0) for k in labels], width, label=a["name"])
    ax.set_xticks(x + width * (len(arms) - 1) / 2, labels, fontsize=8)
    ax.set_xlabel("reorder distance (packets)")
    ax.set_ylabel("packets")
    ax.set_yscale("symlog")
    ax.legend(fontsize=8)
    ax.set_title(f"{doc['experiment']}: reorder distance", fontsize=10)
    return [_save(fig, out_dir, "reorder_distance.png")]


def path_share(doc: ResultsDocument, out_dir: Path) -> list[str]:
    arms = [a for a in _ok(doc) if a.get("path_share")]
    if not arms:
        # Any leaf-spine run: the first leaf's uplink share from its link series.
        arms = []
        for a in _ok(doc):
            ps = links.path_share(a, "leaf1")
            if ps:
                arms.append({**a, "path_share": ps})
    if not arms:
        return []
    fig, axes = plt.subplots(len(arms), 1, figsize=(8, 1.8 * len(arms) + 0.6), squeeze=False, sharex=True)
    for ax, a in zip(axes[:, 0], arms, strict=True):
        ps = a["path_share"]
        names = list(ps["share"])
        ax.stackplot(ps["t"], *[ps["share"][n] for n in names], labels=names)
        for f in a.get("faults") or []:
            if f.get("at_s"):
                ax.axvline(f["at_s"], color="k", ls="--", lw=0.8)
        ax.set_ylim(0, 1)
        ax.set_ylabel("share", fontsize=8)
        ax.set_title(f"{arm_label(a)}: share of leaf1's uplink bytes per spine", fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("time since traffic start (s)")
    return [_save(fig, out_dir, "path_share.png")]


def goodput_over_time(doc: ResultsDocument, out_dir: Path) -> list[str]:
    arms = [a for a in _ok(doc) if any(a.get("goodput_series", {}).get("bps", []))]
    if not arms:
        return []
    fig, ax = plt.subplots(figsize=(8, 4))
    for a in arms:
        gs = a["goodput_series"]
        y = np.asarray(gs["bps"]) / 1e6
        k = 3
        ys = np.convolve(y, np.ones(k) / k, mode="same")
        ax.plot(np.arange(len(y)) * gs["bin_s"], ys, label=a["name"], lw=1)
        for f in a.get("faults") or []:
            if f.get("at_s"):
                ax.axvline(f["at_s"], color="k", ls="--", lw=0.8)
    ideal = max((a.get("ideal_bps") or 0) for a in arms) / 1e6
    if ideal:
        ax.axhline(ideal, color="grey", ls=":", lw=1, label="ideal")
    ax.set_xlabel("time since traffic start (s)")
    ax.set_ylabel("aggregate goodput (Mb/s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{doc['experiment']}: goodput over time", fontsize=10)
    return [_save(fig, out_dir, "goodput_over_time.png")]


def queue_over_time(doc: ResultsDocument, out_dir: Path) -> list[str]:
    """One interface's egress backlog over time per arm (an incast's receiver downlink)."""
    arms = [a for a in _ok(doc) if (a.get("queue_series") or {}).get("t")]
    if not arms:
        return []
    fig, ax = plt.subplots(figsize=(8, 4))
    for a in arms:
        q = a["queue_series"]
        ax.step(q["t"], q["packets"], where="post", label=a["name"], lw=1)
    ax.set_xlabel("time since traffic start (s)")
    ax.set_ylabel(f"packets queued at {arms[0]['queue_series'].get('interface')}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{doc['experiment']}: queue over time", fontsize=10)
    return [_save(fig, out_dir, "queue_over_time.png")]


TRAINING_PARTS = (("data_wait_s", "data wait", "tab:orange"), ("compute_s", "compute", "tab:green"),
                  ("comm_s", "collective", "tab:blue"), ("checkpoint_stall_s", "checkpoint stall", "tab:red"),
                  ("final_flush_s", "last checkpoint's flush", "salmon"))


def _training(doc: ResultsDocument) -> dict[str, dict[str, Any]]:
    t = (doc.get("analysis") or {}).get("training") or {}
    return {name: s for name, s in t.items() if s.get("timeline")}


def training_timelines(doc: ResultsDocument, out_dir: Path) -> list[str]:
    """Per arm, the job's step attempts on the time axis, each cut into where its time went (the rest of
    an attempt that failed or was aborted in grey); attempts rolled back or failed are hatched."""
    t = _training(doc)
    if not t:
        return []
    fig, ax = plt.subplots(figsize=(8, 1.8 + 0.55 * len(t)))
    labels = []
    for row, (name, s) in enumerate(t.items()):
        steps = s["timeline"]
        t0 = min(st["start"] for st in steps)
        for st in steps:
            x = st["start"] - t0
            hatch = "//" if st["outcome"] != "done" or st["lost"] else None
            for key, label, colour in TRAINING_PARTS:
                w = st.get(key, 0.0)
                if w > 0:
                    ax.broken_barh([(x, w)], (row - 0.4, 0.8), facecolors=colour, hatch=hatch, edgecolor="white",
                                   linewidth=0.3, label=label)
                    x += w
            rest = st["start"] - t0 + st["seconds"] - x
            if rest > 1e-6:
                ax.broken_barh([(x, rest)], (row - 0.4, 0.8), facecolors="lightgrey", hatch=hatch,
                               edgecolor="white", linewidth=0.3, label="waiting on another rank")
        labels.append(f"{name}\n{s.get('steps_lost', 0)} lost")
    handles, names = ax.get_legend_handles_labels()
    unique = dict(zip(names, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), fontsize=7, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.08))
    ax.set_yticks(range(len(t)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time since the job started (s); hatched: failed or rolled back")
    ax.grid(alpha=0.3, axis="x")
    fig.suptitle(f"{doc['experiment']}: where each step's time went", fontsize=10)
    return [_save(fig, out_dir, "training_timeline.png")]


def step_time_cdfs(doc: ResultsDocument, out_dir: Path) -> list[str]:
    series = {name: [st["seconds"] - st.get("final_flush_s", 0.0) for st in s["timeline"] if st["outcome"] == "done"]
              for name, s in _training(doc).items()}
    return _cdfs(doc, series, "step time (s)", "step times", out_dir, "step_time_cdf.png")


PLOTS = (utilisation_heatmaps, completion_cdfs, goodput_vs_loss, reorder_histograms, path_share, goodput_over_time,
         queue_over_time, training_timelines, step_time_cdfs)


def render_all(doc: ResultsDocument, out_dir: Path) -> list[str]:
    written = []
    for fn in PLOTS:
        try:
            written += fn(doc, out_dir)
        except Exception as exc:  # one broken plot must not lose the results
            log.warning("plot %s failed: %s", fn.__name__, exc)
    return written
