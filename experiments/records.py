"""A run on disk while it runs: its own results directory, a manifest written before the first arm and
one record per arm written the moment that arm finishes, so that a crash, a full disk or an OOM kill
in a later arm keeps every finished arm's link and CPU samples; `fabriclab report DIR` rebuilds the
run (results.json, summary.md, plots) from them (`load_run`).

    results/NAME/<YYYYmmdd-HHMMSS>[-NN]/
        run.json            the experiment as run, the fabric, when it started (and finished)
        arms/NNN-<arm>.json  per arm, in run order: the arm, its flows and its raw material
        raw/<arm>/           every endpoint's own files (the runner's)

Every file is written whole or not at all: a temporary file of its own in the same directory, fsync,
rename, fsync of the directory. An OSError while writing becomes a ResultsWriteError naming the path.
The rename replaces whatever sat at the path, a symlink included, so a planted link's target is never
written. Every file is read through `read_json`, which takes regular files only (never a FIFO or a
device) up to MAX_READ_MB (FABRICLAB_MAX_RESULTS_MB) and turns anything it cannot use into a
ResultsReadError: a results directory may come from anywhere, and `report` must fail in one line.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np

from experiments.arms import Flow
from experiments.model import Arm, Experiment, arm_from_dict, experiment_from_dict
from experiments.schema import RawArm
from topologies import Topology
from transport.core.config import env_positive

RUN_FILE = "run.json"
ARMS_DIR = "arms"
RESULTS_FILE = "results.json"
MAX_READ_MB = 256  # a run's results.json is a few MB; its largest arm records tens
MAX_READ_ENV = "FABRICLAB_MAX_RESULTS_MB"
_UMASK = os.umask(0o022)
os.umask(_UMASK)


class ResultsWriteError(OSError):
    """A results file or directory could not be written; the message is one line naming it."""


class ResultsReadError(ValueError):
    """A results file that is not one (not a regular file, too large, not JSON, the wrong shape); the
    message is one line naming it, with anything unprintable taken from the file escaped."""

    def __init__(self, message: str) -> None:
        super().__init__("".join(c if c.isprintable() else repr(c)[1:-1] for c in message))


def max_read_mb() -> float:
    try:
        return env_positive(MAX_READ_ENV, MAX_READ_MB, "megabytes")
    except ValueError as exc:
        raise ResultsReadError(str(exc)) from None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_json(path: Path) -> Any:
    """The JSON in `path`, read whole and bounded: a regular file (after symlinks) of at most
    MAX_READ_MB (or FABRICLAB_MAX_RESULTS_MB); anything else is a ResultsReadError naming the file.
    Opened non-blocking, so a FIFO is refused instead of waited on."""
    path, mb = Path(path), max_read_mb()
    limit = int(mb * (1 << 20))
    too_big = (f"{path} is larger than {mb:g} MB, more than a results file holds; if it "
               f"really is one, set {MAX_READ_ENV} to a larger number of megabytes")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ResultsReadError(f"cannot read {path}: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
        os.close(fd)
        if st.st_size > limit:
            raise ResultsReadError(too_big)
        raise ResultsReadError(f"{path} is {_kind(st.st_mode)}, not a regular file; a results directory holds "
                               "plain JSON files")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise ResultsReadError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > limit:  # it grew while being read
        raise ResultsReadError(too_big)
    try:
        return json.loads(data)
    except RecursionError:
        raise ResultsReadError(f"{path} nests its JSON too deeply to be a results file") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise ResultsReadError(f"{path} is not valid JSON ({exc}); it may be truncated or corrupt") from None


def jsonable(obj: Any) -> Any:
    """`json.dumps` default for what the runner's records hold besides plain data."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")


def write_error(path: Path, exc: OSError) -> ResultsWriteError:
    return ResultsWriteError(f"cannot write {path}: {exc.strerror or exc}")


def atomic_write(path: Path, text: str | bytes) -> Path:
    """Write `text` to `path` so that a reader (or a crash) sees the old file or the whole new one. A
    symlink at `path` is replaced by the file, its target left as it was."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.chmod(tmp, 0o666 & ~_UMASK)  # as open() would have made it: mkstemp's is 0600
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode() if isinstance(text, str) else text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        _fsync_dir(path.parent)
    except OSError as exc:
        raise write_error(path, exc) from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return path


def atomic_write_json(path: Path, obj: Any) -> Path:
    return atomic_write(path, json.dumps(obj, indent=1, default=jsonable) + "\n")


def _fsync_dir(path: Path) -> None:
    # The rename is durable only once the directory entry is: fsync the directory too.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def new_run_dir(root: Path, name: str, now: float | None = None) -> Path:
    """A directory of its own for a run of `name` under `root`: named after the second it started,
    with -02, -03, ... when another run took that name (created exclusively, so two runs in the same
    second never share one; the names still sort in the order the runs started)."""
    parent = Path(root) / name
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    try:
        parent.mkdir(parents=True, exist_ok=True)
        for n in count(1):
            candidate = parent / (stamp if n == 1 else f"{stamp}-{n:02d}")
            try:
                candidate.mkdir()
                return candidate
            except FileExistsError:
                continue
    except OSError as exc:
        raise write_error(parent, exc) from None
    raise AssertionError("unreachable")


def arm_slug(arm: Arm, repetition: int, repetitions: int) -> str:
    """The arm's name as a file name (and its repetition when the run repeats)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", arm.name) + (f"-rep{repetition + 1}" if repetitions > 1 else "")


def write_manifest(out_dir: Path, exp: Experiment, topo: Topology, started: float,
                   finished: float | None = None, complete: bool | None = None, engine: str = "live") -> Path:
    return atomic_write_json(Path(out_dir) / RUN_FILE, {
        "experiment": exp.to_dict(), "topology": topo.to_dict(), "started": started,
        "finished": finished, "complete": complete, "engine": engine,
    })


def write_arm(out_dir: Path, index: int, slug: str, arm: Arm, raw: dict[str, Any], flows: list[Flow],
              bytes_per_flow: int) -> Path:
    """The record of one finished arm (an errored or interrupted one too: its error is its result)."""
    return atomic_write_json(Path(out_dir) / ARMS_DIR / f"{index:03d}-{slug}.json", {
        "index": index, "arm": asdict(arm), "flows": [asdict(f) for f in flows],
        "bytes_per_flow": bytes_per_flow, "finished": time.time(), "raw": raw,
    })


@dataclass
class RunOutcome:
    """What a run yielded: every arm's raw record, whether the run finished, and the flows it ran."""

    raws: list[tuple[Arm, RawArm]]
    complete: bool
    started: float
    finished: float
    flows: dict[str, list[Flow]]  # arm name -> its flows
    bytes_per_flow: dict[str, int]
    engine: str = "live"  # "live" (the emulator) or "sim" (the simulated engine)


def has_records(out_dir: Path) -> bool:
    return (Path(out_dir) / RUN_FILE).is_file()


def load_run(out_dir: Path) -> tuple[Experiment, Topology, RunOutcome]:
    """The experiment, fabric and outcome of a run from its manifest and arm records, as far as it got
    (a run that never wrote its end is incomplete). A record of the wrong shape is a ResultsReadError."""
    out_dir = Path(out_dir)
    manifest_path = out_dir / RUN_FILE
    manifest = read_json(manifest_path)
    with _shape_of(manifest_path):
        exp = experiment_from_dict(manifest["experiment"])
        topo = Topology.from_dict(manifest["topology"])
        started = float(manifest["started"])
        finished = manifest.get("finished")
        finished = None if finished is None else float(finished)
    paths = sorted((out_dir / ARMS_DIR).glob("[0-9][0-9][0-9]-*.json")) if (out_dir / ARMS_DIR).is_dir() else []
    raws: list[tuple[Arm, dict[str, Any]]] = []
    flows: dict[str, list[Flow]] = {}
    nbytes: dict[str, int] = {}
    for path in paths:
        rec = read_json(path)
        with _shape_of(path):
            arm = arm_from_dict(rec["arm"])
            if not isinstance(rec["raw"], dict):
                raise TypeError(f"'raw' is {type(rec['raw']).__name__}, not an object")
            raws.append((arm, rec["raw"]))
            flows[arm.name] = [Flow(**f) for f in rec["flows"]]
            nbytes[arm.name] = int(rec["bytes_per_flow"])
            if manifest.get("finished") is None:
                finished = max(finished or 0.0, float(rec.get("finished") or 0.0))
    complete = bool(manifest.get("complete"))
    engine = str(manifest.get("engine") or "live")
    return exp, topo, RunOutcome(raws, complete, started, finished or started, flows, nbytes, engine)


@contextmanager
def _shape_of(path: Path) -> Iterator[None]:
    """A record that parsed but is not what the run wrote (a key missing, a value of another type)
    becomes a ResultsReadError naming the file and what was wrong."""
    try:
        yield
    except KeyError as exc:
        raise ResultsReadError(f"{path} has no key {exc}; it is not a record this run wrote") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise ResultsReadError(f"{path} is not a record this run wrote: {exc}") from None
