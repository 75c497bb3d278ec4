"""The project's import structure, read from the source with `ast`: no import circle, and the transport
at the bottom of the stack.

Every module of the project's packages is parsed; each import (relative ones resolved) becomes an arrow
to the project module it names (`from a.b import c` names a.b.c when that is a module, else a.b).
Imports at module level, under `if TYPE_CHECKING:` included, form the module graph that must have no
cycle. Imports inside functions run later, but a circle through them still ties the modules together,
so they are checked too, in a graph of their own, against a short list of the ones allowed with why.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What sits above the transport: it may import none of these.
ABOVE_TRANSPORT = {"cli", "experiments", "emulator", "topologies", "labs", "live"}
# Deferred (function-level) imports allowed to close a circle, with the reason. Keep it empty if you can.
ALLOWED_DEFERRED: dict[tuple[str, str], str] = {}


def packages() -> list[str]:
    """The project's top-level packages: the folders with an __init__.py, tests left out."""
    return sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "tests")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@dataclass(frozen=True)
class Arrow:
    source: str
    target: str
    line: int
    deferred: bool  # inside a function: runs when it is called, not when the module is imported


class _Imports(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool) -> None:
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.depth = 0
        self.found: list[tuple[str, list[str], int, bool]] = []  # (base, names, line, deferred)

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.found.append((alias.name, [], node.lineno, self.depth > 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base_parts = self.package.split(".")
            if node.level > 1:
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
            base = ".".join([*base_parts, *([node.module] if node.module else [])])
        else:
            base = node.module or ""
        self.found.append((base, [a.name for a in node.names], node.lineno, self.depth > 0))


def project_modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for pkg in packages():
        for path in sorted((ROOT / pkg).rglob("*.py")):
            found[module_name(path)] = path
    return found


def arrows(modules: dict[str, Path]) -> Iterator[Arrow]:
    for name, path in modules.items():
        visitor = _Imports(name, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(), filename=str(path)))
        for base, names, line, deferred in visitor.found:
            targets = [f"{base}.{n}" for n in names if f"{base}.{n}" in modules]
            if len(targets) < len(names) and base in modules:
                targets.append(base)  # names defined in the module itself
            if not names and base in modules:
                targets.append(base)
            for target in targets:
                if target != name:
                    yield Arrow(name, target, line, deferred)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None: depth-first search with colours."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def _graph(found: list[Arrow], *, deferred: bool) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for a in found:
        if (not a.deferred or deferred) and (a.source, a.target) not in ALLOWED_DEFERRED:
            graph.setdefault(a.source, set()).add(a.target)
    return graph


def _show(cycle: list[str], found: list[Arrow]) -> str:
    where = {(a.source, a.target): a for a in found}
    steps = []
    for src, dst in itertools.pairwise(cycle):
        a = where[(src, dst)]
        steps.append(f"{src} -> {dst} (line {a.line}{', in a function' if a.deferred else ''})")
    return "import circle: " + "; ".join(steps)


def test_the_reader_finds_the_project_and_its_imports() -> None:
    modules = project_modules()
    assert {"transport", "cli", "experiments", "emulator", "topologies"} <= set(packages())
    found = list(arrows(modules))
    pairs = {(a.source, a.target) for a in found}
    # Absolute, relative-free and deferred imports all become arrows.
    assert ("transport.core.connection", "transport.core.config") in pairs
    assert ("cli.main", "cli.args") in pairs
    assert any(a.deferred for a in found)
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle_at_module_level() -> None:
    found = list(arrows(project_modules()))
    cycle = find_cycle(_graph(found, deferred=False))
    assert cycle is None, _show(cycle, found)


def test_no_import_circle_through_imports_inside_functions() -> None:
    found = list(arrows(project_modules()))
    cycle = find_cycle(_graph(found, deferred=True))
    assert cycle is None, _show(cycle, found) + " (a deferred import does not make a circle go away)"


def test_the_transport_imports_nothing_above_it() -> None:
    found = list(arrows(project_modules()))
    upward = [f"{a.source} -> {a.target} (line {a.line})" for a in found
              if a.source.split(".")[0] == "transport" and a.target.split(".")[0] in ABOVE_TRANSPORT]
    assert not upward, upward


def test_the_transport_core_imports_nothing_of_its_io_or_simulation() -> None:
    found = list(arrows(project_modules()))
    outward = [f"{a.source} -> {a.target}" for a in found
               if a.source.startswith("transport.core.") and a.target.split(".")[:2] != ["transport", "core"]
               and a.target.startswith("transport.")]
    assert not outward, outward
