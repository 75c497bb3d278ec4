"""Sample outputs and answer-key figures made from what the labs ship, so they cannot drift from it.

A lab's README or answer key (labs/answers/) marks a block it does not write by hand:

    <!-- generated: KIND LAB -->
    ...
    <!-- end generated -->

and `python -m labs.references` rewrites every such block from the lab's shipped reference run (or,
for the model's figures, from the simulated job the checker uses); `--check` changes nothing and
exits 1 naming each block that differs. KINDs:

- `check`: what `fabriclab lab check LAB` prints on the reference run (its PASS/FAIL lines);
- `table`: the arms table of the reference run's summary.md;
- `sentences`: the sentences of the reference run's summary.md (one per arm, then the comparisons);
- `retx`: lab 3's retransmissions per loss rate, selective repeat against go-back-N;
- `distances`: lab 2's reorder distances per arm, bucket by bucket;
- `reroute`: lab 4's cut link, controller reroute and recovery per arm;
- `model`: lab 7's figures from the simulated job its checker holds the formulas to;
- `bench`: lab 7's step 1, `fabriclab bench training` on step 2's arms: the model's sentences.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path

from labs import grading
from labs.catalogue import LABS_DIR, Lab, find_lab, load_checker

log = logging.getLogger(__name__)

EN_DASH = "\u2013"  # ranges as the answer keys write them
BLOCK = re.compile(r"(<!-- generated: (\w+) (\d+) -->\n)(.*?)(<!-- end generated -->)", re.S)


def reference_run(lab: Lab) -> Path:
    """The lab's (first) shipped reference run's folder."""
    runs = sorted((lab.path / "reference").glob("*/*/results.json"))
    if not runs:
        raise FileNotFoundError(f"{lab.path.name} ships no reference run")
    return runs[0].parent


def _check(lab: Lab) -> str:
    text, _ = grading.render(load_checker(lab).check(reference_run(lab)))
    return f"```text\n{text}\n```\n"


def _summary_lines(lab: Lab) -> list[str]:
    return (reference_run(lab) / "summary.md").read_text(encoding="utf-8").splitlines()


def _table(lab: Lab) -> str:
    rows = [line for line in _summary_lines(lab) if line.startswith("|")]
    return "\n".join(rows) + "\n"


def _sentences(lab: Lab) -> str:
    lines = _summary_lines(lab)
    start = next(i for i, line in enumerate(lines) if line.startswith("|")) + 1
    out = []
    for line in lines[start:]:
        if line.startswith("|"):
            continue
        if line.startswith(("Fidelity:", "#")):
            break
        if line.strip():
            out.append(f"- {line.strip()}")
    return "\n".join(out) + "\n"


def _retx(lab: Lab) -> str:
    doc = json.loads((reference_run(lab) / "results.json").read_text())
    arms = {a["name"]: a for a in doc["arms"]}
    out = ["| loss | selective: retx (per packet delivered) | go-back-N: retx (per packet delivered) | ratio |",
           "|---|---|---|---|"]
    for loss in ("0.1", "1", "5"):
        cells = []
        per = []
        for rec in ("selective", "gobackn"):
            a = arms[f"{rec}@{loss}%"]
            data = sum(f.get("data_packets") or 0 for f in a["flows"])
            retx = a.get("retransmissions") or 0
            per.append(retx / data if data else 0.0)
            cells.append(f"{retx} ({per[-1]:.3f})")
        ratio = f"{per[1] / per[0]:.1f}x" if per[0] else "-"
        out.append(f"| {loss} % | {cells[0]} | {cells[1]} | {ratio} |")
    return "\n".join(out) + "\n"


def _distances(lab: Lab) -> str:
    """Lab 2: each arm's reorder distances, bucket by bucket (the empty ones left out)."""
    doc = json.loads((reference_run(lab) / "results.json").read_text())
    lines = []
    for a in doc["arms"]:
        hist = (a.get("reorder") or {}).get("distance_histogram") or {}
        ordered = sorted(hist.items(), key=lambda kv: int(kv[0].split("-")[0].rstrip("+")))
        shown = ", ".join(f"{k.replace('-', EN_DASH)}: {v}" for k, v in ordered if v)
        lines.append(f"- {a['name']}: {shown or 'none out of order'}")
    return "\n".join(lines) + "\n"


def _reroute(lab: Lab) -> str:
    """Lab 4: per arm, the cut link, how long the controller took to confirm its new rules, and the
    recovery (in seconds and RTOs)."""
    doc = json.loads((reference_run(lab) / "results.json").read_text())
    lines = []
    for a in doc["arms"]:
        cut = next((f"{f['a']}-{f['b']}" for f in a.get("faults") or []), "no cut")
        took = [e["took_ms"] for e in a.get("events") or [] if e.get("kind") == "link_down" and "took_ms" in e]
        rules = f"new rules confirmed {took[0]:.1f} ms after the port status" if took else "no reroute recorded"
        rec, rto = a.get("recovery_s"), a.get("rto_s")
        back = f"recovery {rec:.3f} s" + (f" ({rec / rto:.1f} RTOs of {rto * 1e3:.1f} ms)" if rec and rto else "")
        lines.append(f"- {a['name']}: cut {cut}; {rules}; {back}")
    return "\n".join(lines) + "\n"


def _model(lab: Lab) -> str:
    check = load_checker(lab)
    write = check._sync_write_s(check._sim())
    step = check._sim(0).summary["step_time_p50_s"]
    lines = [f"- a synchronous checkpoint to far storage (4 ranks x 128 KiB through 2 Mb/s): the last write "
             f"is in after {write:.2f} s (the formula: {4 * 128 * 1024 * 8 / 2e6:.2f} s)",
             f"- a step without checkpoints: p50 {step:.2f} s"]
    for every, steps in ((1, 6), (4, 8)):
        s = check._sim(every, "async", steps).summary
        per = s["checkpoint_stall_s"] / max(1, s["checkpoints"] - 1)
        lines.append(f"- asynchronous checkpoints every {every} step(s) (interval {every * step:.2f} s): "
                     f"{per:.2f} s of stall per checkpoint after the first (the formula: "
                     f"{max(0.0, write - every * step):.2f} s)")
    for cut in (("rank2", 2.0, 8.0), ("rank2", 6.3, 12.3)):
        r = check._sim(4, "sync", 10, cut)
        rb = next(rep["rollbacks"][0] for rep in r.reports if rep["rollbacks"])
        lines.append(f"- a cut from {cut[1]:g} s: step {rb['failed_step']} timed out, the job restarted from "
                     f"step {rb['restart_from']}'s checkpoint and lost {rb['steps_lost']} steps")
    return "\n".join(lines) + "\n"


def _bench(lab: Lab) -> str:
    """Lab 7's step 1: `fabriclab bench training` on step 2's arms (seed 1), its sentences."""
    from experiments.scenarios import training

    check = load_checker(lab)
    doc = training.simulate(None, check.MAIN_ARMS)
    doc["arms"] = [{"name": a} for a in doc["analysis"]["training"]]
    return "\n".join(f"- {line}" for line in training.sentences(doc)) + "\n"


KINDS: dict[str, Callable[[Lab], str]] = {"check": _check, "table": _table, "sentences": _sentences,
                                          "retx": _retx, "model": _model, "bench": _bench,
                                          "distances": _distances, "reroute": _reroute}


def documents(root: Path = LABS_DIR) -> list[Path]:
    """Every file that may hold generated blocks: the labs' READMEs and the answer keys."""
    return sorted(root.glob("[0-9][0-9]-*/README.md")) + sorted((root / "answers").glob("*.md"))


def regenerate(text: str, root: Path = LABS_DIR) -> str:
    """text with every generated block made again."""
    # The checkers' random cases play no part on a results folder; a fixed seed keeps it so.
    grading.use_seed(1)

    def fill(m: re.Match[str]) -> str:
        kind, number = m.group(2), int(m.group(3))
        if kind not in KINDS:
            raise ValueError(f"unknown generated block kind {kind!r}; known: {', '.join(KINDS)}")
        return m.group(1) + KINDS[kind](find_lab(number, root)) + m.group(5)

    return BLOCK.sub(fill, text)


def stale(root: Path = LABS_DIR) -> list[str]:
    """The blocks that differ from what the shipped files give: 'FILE: KIND LAB'."""
    out = []
    for path in documents(root):
        text = path.read_text(encoding="utf-8")
        fresh = regenerate(text, root)
        if fresh != text:
            old = {(m.group(2), m.group(3)): m.group(4) for m in BLOCK.finditer(text)}
            new = {(m.group(2), m.group(3)): m.group(4) for m in BLOCK.finditer(fresh)}
            out += [f"{path.relative_to(root.parent)}: {k} {n}" for (k, n) in old if old[k, n] != new[k, n]]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labs.references", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale")
    args = parser.parse_args(argv)
    # Only this script's own lines: the simulated jobs log every timeout they model.
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    if args.check:
        bad = stale()
        for line in bad:
            log.error("stale: %s (python -m labs.references remakes it)", line)
        return 1 if bad else 0
    for path in documents():
        text = path.read_text(encoding="utf-8")
        fresh = regenerate(text)
        if fresh != text:
            path.write_text(fresh, encoding="utf-8")
            log.info("rewrote %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
