"""From an experiment name to a results directory: run the arms, build results.json, analyse, write
summary.md and the plots; and re-render a stored results.json (`fabriclab report`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from experiments import arms, catalogue, overrides, plots, records, report, results
from experiments.analysis.placement import ideal_bps
from experiments.model import DoesNotFit, Experiment
from experiments.policy_arm import fault_sentences
from experiments.runner import Reporter, RunOutcome, plan_flows, run_experiment
from experiments.scenarios.common import repetitions_sentence
from experiments.schema import SCHEMA_VERSION, ResultsDocument
from topologies import Topology, parse_spec
from topologies.model import natural_key

log = logging.getLogger(__name__)

DEFAULT_OUT = Path("results")


@dataclass
class Rendered:
    doc: ResultsDocument
    out_dir: Path
    summary: Path
    plots: list[str]
    sentences: list[str]


def build_document(exp: Experiment, topo: Topology, outcome: RunOutcome) -> ResultsDocument:
    """results.json as a dict: arms with their metrics, then the experiment's own analysis."""
    entries = []
    first_flows = next(iter(outcome.flows.values()), [])
    for arm, raw in outcome.raws:
        flows = outcome.flows.get(arm.name, first_flows)
        pairs = [(f.src, f.dst) for f in flows]
        ideal = ideal_bps(topo, pairs) if arms.get(arm.kind).point_to_point and pairs else 0.0
        entries.append(results.arm_result(arm, raw, topo, ideal, bool(outcome.bytes_per_flow.get(arm.name))))
    doc: ResultsDocument = {
        "schema": SCHEMA_VERSION,
        "experiment": exp.name,
        "engine": outcome.engine,
        "title": exp.title,
        "description": exp.description,
        "topology": {"spec": exp.topology, "name": topo.name, "params": dict(topo.params),
                     "fabric": topo.to_dict()},
        "seed": exp.seed,
        "duration_s": exp.duration_s,
        "repetitions": exp.repetitions,
        "bytes_per_flow": next(iter(outcome.bytes_per_flow.values()), 0),
        "flows": [{"src": f.src, "dst": f.dst} for f in first_flows],
        "arms": entries,
        "analysis": {},
        "extra": dict(exp.extra),
        "complete": outcome.complete and len(outcome.raws) == len(exp.arms) * exp.repetitions,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(outcome.started)),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(outcome.finished)),
        "experiment_definition": exp.to_dict(),
    }
    results.label_repetitions(doc)
    analyse(doc, topo)
    return doc


def analyse(doc: ResultsDocument, topo: Topology) -> None:
    entry = catalogue.CATALOGUE.get(doc["experiment"])
    if entry is not None:
        try:
            doc["analysis"] = entry.analyse(doc, topo)
        except Exception as exc:  # keep the measurements even if an analysis step breaks
            log.exception("analysis of %s failed", doc["experiment"])
            doc["analysis"] = {"error": f"{type(exc).__name__}: {exc}"}
    doc["fidelity"] = results.worst_fidelity(doc["arms"])


def sentences_for(doc: ResultsDocument) -> list[str]:
    entry = catalogue.CATALOGUE.get(doc["experiment"])
    if entry is None or "error" in doc.get("analysis", {}):
        return []
    try:
        return (repetitions_sentence(doc, entry.across_repetitions) + entry.sentences(doc)
                + fault_sentences(doc))
    except Exception as exc:
        log.warning("summary sentences for %s failed: %s", doc["experiment"], exc)
        return []


def render(doc: ResultsDocument, out_dir: Path) -> Rendered:
    """Write results.json, the plots and summary.md into out_dir."""
    results.save(doc, out_dir)
    return _render_views(doc, out_dir)


def _render_views(doc: ResultsDocument, out_dir: Path) -> Rendered:
    results.label_repetitions(doc)  # a document stored before arms carried labels
    try:
        written = plots.render_all(doc, out_dir)
        sentences = sentences_for(doc)
        summary = report.write_summary(doc, sentences, written, out_dir)
    except OSError as exc:
        raise records.write_error(Path(exc.filename or out_dir), exc) from None
    return Rendered(doc, out_dir, summary, written, sentences)


def rerender(path: Path) -> Rendered:
    """`fabriclab report DIR`: the table, sentences and plots again from a stored results.json; or,
    when the run never wrote one (it crashed, or was killed), the whole run rebuilt from its arms'
    records. A folder that is not a run's (a file of the wrong shape, a FIFO, a device, a huge file)
    is a ResultsReadError naming the file; outputs replace what sat at their paths, symlinks included."""
    path = Path(path)
    if path.is_dir() and not (path / records.RESULTS_FILE).exists() and records.has_records(path):
        return rebuild(path)
    doc = results.load(path)
    with _renderable(path):
        return _render_views(doc, path if path.is_dir() else path.parent)


def rebuild(out_dir: Path) -> Rendered:
    """results.json, summary.md and the plots of a run from its manifest and per-arm records."""
    exp, topo, outcome = records.load_run(out_dir)
    with _renderable(out_dir):
        doc = build_document(exp, topo, outcome)
    return render(doc, out_dir)


@contextmanager
def _renderable(where: Path) -> Iterator[None]:
    # What the schema cannot say (a fabric whose links name no node, a value out of its range) still
    # makes stored material unusable: one line naming the folder, the traceback only with -vv.
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ArithmeticError) as exc:
        log.debug("rendering %s failed", where, exc_info=True)
        raise records.ResultsReadError(f"{where} does not hold a run that can be rendered "
                                       f"({type(exc).__name__}: {exc})") from None


def prepare(name: str, topo: str | None = None, duration: float | None = None, seed: int | None = None,
            repetitions: int | None = None, arms: Sequence[str] | None = None) -> tuple[Experiment, Topology]:
    entry = catalogue.get(name)
    exp = overrides.with_overrides(entry.build(), topology=topo, duration=duration, seed=seed,
                                   repetitions=repetitions, arms=arms)
    return exp, parse_spec(exp.topology)


def check_fits(exp: Experiment, topo: Topology) -> None:
    """Raise DoesNotFit when an arm's faults or flows name a link or host that `topo` lacks.

    Experiments name parts of their own fabric (a loss on leaf1-spine1, far storage behind h7-leaf3,
    a flow from h1 to h2); on another fabric those names may not exist, and each arm would fail on
    its own after a bring-up. Run before anything is brought up, once `--traffic` has replaced the
    flows (a traffic matrix's hosts need no check: they are numbered within the fabric).
    """
    entry = catalogue.CATALOGUE.get(exp.name)
    own = entry.build().topology if entry else None
    fix = "choose a fabric that has those names"
    if own and own != exp.topology:
        fix = f"run it on its own fabric ({own}, the default) or on one that has those names"
    hosts = {h.name for h in topo.hosts}
    for arm in exp.arms:
        for f in arm.faults:
            if f.a != "auto" and not topo.links_between(f.a, f.b):
                raise DoesNotFit(f"{exp.name}'s arm {arm.name} acts on the link {f.a}-{f.b}, which {exp.topology} "
                                 f"does not have; {fix}")
        workload = arm.workload or exp.workload
        if workload.pattern == "pairs":
            missing = sorted({h for pair in workload.pairs for h in pair} - hosts, key=natural_key)
            if missing:
                raise DoesNotFit(f"{exp.name}'s flows run between hosts that {exp.topology} does not have "
                                 f"({', '.join(missing)}); {fix}")
        plan_flows(workload, topo, exp.seed)  # flows the fabric cannot carry fail here too


def execute(exp: Experiment, topo: Topology, out_root: Path = DEFAULT_OUT, reporter: Reporter | None = None,
            out_dir: Path | None = None, engine: str = "live") -> Rendered:
    check_fits(exp, topo)  # before a results directory exists
    if out_dir is None:
        out_dir = records.new_run_dir(out_root, exp.name)
    else:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise records.write_error(out_dir, exc) from None
    if engine == "sim":
        from experiments.sim_arm import check_arm

        for arm in exp.arms:  # before a results directory exists
            check_arm(arm, arm.workload or exp.workload)
    outcome = run_experiment(exp, topo, out_dir, reporter, engine=engine)
    doc = build_document(exp, topo, outcome)
    return render(doc, out_dir)
