"""Rendering results: the comparison table (text for the terminal, Markdown for summary.md) and
summary.md itself, whose sentences come from the experiment's own analysis of the numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments import records
from experiments.analysis.fidelity import STEAL_NOTE
from experiments.schema import ResultsDocument, arm_label

COLUMNS = (
    ("arm", "name"),
    ("goodput", "goodput_bps"),
    ("of ideal", "goodput_fraction"),
    ("of wire", "goodput_of_wire"),
    ("imbalance", "link_imbalance"),
    ("hot links", "hot_links"),
    ("compl. p50", "completion_p50_s"),
    ("compl. p99", "completion_p99_s"),
    ("slowdown mean", "slowdown_mean"),
    ("slowdown max", "slowdown_max"),
    ("retx", "retransmissions"),
    ("out of order", "reorder"),
    ("CPU idle min", "fidelity"),
)


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key == "goodput_bps":
        return f"{value / 1e6:.2f} Mb/s"
    if key in ("goodput_fraction", "goodput_of_wire"):
        return f"{value:.0%}"
    if key in ("link_imbalance", "slowdown_mean", "slowdown_max"):
        return f"{value:.2f}"
    if key == "hot_links":
        return ", ".join(value) if value else "none"
    if key.endswith("_s"):
        return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"
    if key == "reorder":
        return f"{value.get('out_of_order_fraction', 0):.1%}"
    if key == "fidelity":
        idle = value.get("cpu_idle_min")
        mark = "" if value.get("trusted") else " (!)"
        return ("-" if idle is None else f"{idle:.0%}") + mark
    return str(value)


def table_rows(doc: ResultsDocument) -> list[list[str]]:
    rows = []
    for a in doc["arms"]:
        if a.get("error"):
            rows.append([arm_label(a), f"ERROR: {a['error']}"[:80]] + [""] * (len(COLUMNS) - 2))
            continue
        # Workloads without a fabric-wide ideal (ping, all-reduce) have no "of ideal" to show.
        shown = {k: (None if k in ("goodput_fraction", "goodput_of_wire") and not a.get("ideal_bps") else a.get(k))
                 for _, k in COLUMNS}
        rows.append([arm_label(a)] + [_fmt(k, shown[k]) for _, k in COLUMNS[1:]])
    return rows


def markdown_table(doc: ResultsDocument) -> str:
    head = [c for c, _ in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(doc)]
    return "\n".join(lines)


def text_table(doc: ResultsDocument) -> str:
    head = [c for c, _ in COLUMNS]
    rows = table_rows(doc)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in rows])


def fidelity_sentences(doc: ResultsDocument) -> list[str]:
    if doc.get("engine") == "sim":
        return simulated_sentences(doc)
    f = doc["fidelity"]
    idle_min, idle_mean = f.get("cpu_idle_min"), f.get("cpu_idle_mean")
    if idle_min is None and not f.get("trusted") and not f.get("reasons"):
        # Every arm failed before its traffic (or the run was stopped first): there is no verdict to give,
        # and blaming the emulator would send the reader after the wrong cause.
        return ["Fidelity: not measured, since no arm ran its traffic."]
    idle = ("CPU idle " + (f"min {idle_min:.0%}, mean {idle_mean:.0%}" if idle_min is not None else "not measured"))
    head = (f"Fidelity: {idle}; switches forwarded at most {f.get('switch_pps_peak', 0) / 1e3:.1f} kpps "
            f"(ceiling ~{f.get('ovs_ceiling_pps', 0) / 1e3:.0f} kpps); {f.get('drops_outside_queues', 0)} drops "
            "outside the shaped queues.")
    across = [a for a in doc["arms"] if a.get("server_cpu_idle")]
    if across:
        worst = {}
        for a in across:
            for server, share in a["server_cpu_idle"].items():
                worst[server] = min(worst.get(server, 1.0), share)
        head += (f" Across {len(worst)} servers ({across[0].get('cross_server_links', 0)} links carried by ssh "
                 "tunnels); each server's CPU idle over the traffic, worst arm: "
                 + ", ".join(f"{s} {v:.0%}" for s, v in sorted(worst.items())) + ".")
    steal = f.get("cpu_steal_max")
    if steal is not None and steal >= STEAL_NOTE:
        head += (f" The hypervisor gave up to {steal:.0%} of this machine's CPU to other guests during the traffic "
                 "(steal time, counted as busy: the emulator lost it all the same).")
    if f.get("trusted"):
        return [head + " The emulator kept up: the numbers reflect the emulated fabric."]
    out = [head + " **These numbers cannot be trusted as a model of the fabric**: the emulator itself was a "
           "bottleneck. Run with lower link rates (e.g. `--topo` with a smaller `rate`/`host_rate`) or fewer hosts."]
    out += [f"- {r}" for r in f.get("reasons", [])]
    return out


def simulated_sentences(doc: ResultsDocument) -> list[str]:
    """What the simulated engine did for each arm: events, packet-hops, virtual and wall time, events/s
    and peak memory (in place of the live engine's CPU fidelity, which a virtual clock does not need)."""
    out = []
    for a in doc["arms"]:
        s = a.get("sim") or {}
        if not s:
            continue
        rate = f"{s['events_per_s'] / 1e3:.0f} k events/s" if s.get("events_per_s") else "-"
        out.append(f"Simulated {arm_label(a)}: {s.get('events', 0):,} events, {s.get('packet_hops', 0):,} "
                   f"packet-hops, {s.get('virtual_s', 0) * 1e3:.3f} ms of virtual time in {s.get('wall_s', 0):.1f} s "
                   f"({rate}), peak memory {s.get('peak_memory_mb', 0):.0f} MB.")
    reasons = doc["fidelity"].get("reasons", [])
    out += [f"- {r}" for r in reasons]
    return out


def _seeds_and_arms(doc: ResultsDocument) -> str:
    reps = doc.get("repetitions") or 1
    arms = len({a["name"] for a in doc["arms"]})
    per_arm = f"{doc['duration_s']:g} s per arm"
    if reps <= 1:
        return f"seed {doc['seed']}, {per_arm}, {arms} arm(s)"
    return (f"seeds {doc['seed']}-{doc['seed'] + reps - 1} (one per repetition), {per_arm}, {arms} arm(s), "
            f"{reps} repetitions of each")


def summary_markdown(doc: ResultsDocument, sentences: list[str], plots: list[str]) -> str:
    topo = doc["topology"]
    lines = [
        f"# {doc['experiment']}: {doc.get('title', '')}",
        "",
        doc.get("description", ""),
        "",
        f"Fabric `{topo.get('spec')}` ({topo.get('name')}), {_seeds_and_arms(doc)}, each on a freshly brought-up fabric"
        + ("" if doc.get("complete") else " — **incomplete run** (interrupted; finished arms kept)") + ".",
        "",
        markdown_table(doc),
        "",
    ]
    lines += sentences
    lines += ["", *fidelity_sentences(doc)]
    errors = [a for a in doc["arms"] if a.get("error")]
    if errors:
        lines += ["", "Arms that failed: " + "; ".join(f"{arm_label(a)}: {a['error']}" for a in errors) + "."]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    # Each arm once, however many repetitions it ran.
    details = {a["name"]: a["description"] for a in doc["arms"]}
    lines += ["", "Arm details:", ""] + [f"- **{name}**: {what}" for name, what in details.items()]
    return "\n".join(lines) + "\n"


def write_summary(doc: ResultsDocument, sentences: list[str], plots: list[str], out_dir: Path) -> Path:
    return records.atomic_write(out_dir / "summary.md", summary_markdown(doc, sentences, plots))
