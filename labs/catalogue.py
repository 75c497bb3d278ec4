"""Finding the labs: every folder `NN-slug/` beside this module holding a README.md is lab NN.

A lab's title is its README's first `# ` heading and its summary the first paragraph after it, so the
list `fabriclab labs` prints cannot drift from what students read.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

LABS_DIR = Path(__file__).resolve().parent
_FOLDER = re.compile(r"^(\d{2})-[a-z0-9-]+$")


class LabError(Exception):
    """Bad input to a lab command (no such lab, nothing to grade): one line with the fix."""


@dataclass(frozen=True)
class Lab:
    number: int
    slug: str
    path: Path
    title: str
    summary: str

    @property
    def checker(self) -> Path:
        return self.path / "check.py"


def _heading_and_summary(readme: Path) -> tuple[str, str]:
    title, para, seen_title = "", [], False
    for line in readme.read_text().splitlines():
        if not seen_title:
            if line.startswith("# "):
                title, seen_title = line[2:].strip(), True
            continue
        if not line.strip():
            if para:
                break
            continue
        if line.startswith(("#", "```", ">", "|", "-", "*")) and not para:
            continue
        para.append(line.strip())
    return title, " ".join(para)


def all_labs(root: Path = LABS_DIR) -> list[Lab]:
    labs = []
    for path in sorted(root.iterdir()):
        m = _FOLDER.match(path.name)
        if m and (path / "README.md").is_file():
            title, summary = _heading_and_summary(path / "README.md")
            labs.append(Lab(int(m.group(1)), path.name, path, title, summary))
    return labs


def find_lab(number: int, root: Path = LABS_DIR) -> Lab:
    labs = all_labs(root)
    for lab in labs:
        if lab.number == number:
            return lab
    have = ", ".join(str(lab.number) for lab in labs) or "none"
    raise LabError(f"no lab {number}; the labs are {have} (see `fabriclab labs`)")


def load_checker(lab: Lab) -> ModuleType:
    """Lab's check.py as a module (its `check(target)` grades a results or code folder)."""
    if not lab.checker.is_file():
        raise LabError(f"lab {lab.number} has no check.py in {lab.path}")
    return import_file(lab.checker, f"labs_check_{lab.number:02d}")


def import_file(path: Path, name: str) -> ModuleType:
    """Execute path as module `name`, registered in sys.modules while and after it runs (dataclasses
    look their module up there); a module that fails to import is unregistered and the error raised."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module
