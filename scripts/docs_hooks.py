"""MkDocs hook (mkdocs.yml `hooks:`): the pages that are generated from the code, not written by hand.

- `<!-- layout -->` in a page becomes the project's layout: every package under the top-level folders,
  its docstring's first paragraph, and each module with the first line of its docstring.
- `<!-- api: module:Name -->` becomes the reference of a class (its docstring, constructor and public
  methods) or of a function (signature and docstring).
- A page written beside the others (OPTIONAL_PAGES) joins the navigation once its file exists.

Both read the source with `ast` and import nothing, so the site builds without root, Mininet or Open
vSwitch, and a module or docstring that changes changes the site with it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The importable top-level folders, in the order the design card names them.
PACKAGES = ["topologies", "emulator", "transport", "experiments", "live", "labs", "cli"]

# Pages that may not exist yet: file -> (nav section, title, the entry it follows). mkdocs.yml cannot
# name a missing file, and --strict refuses a file the nav does not name.
OPTIONAL_PAGES = {"engines.md": ("Design", "The two engines", "The emulator")}

LAYOUT = re.compile(r"<!-- layout -->")
API = re.compile(r"<!-- api: ([\w.]+):(\w+) -->")


def first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def first_sentence(doc: str | None) -> str:
    text = first_paragraph(doc)
    m = re.match(r"(.+?\.)(\s|$)", text)
    return m.group(1) if m else text


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def packages() -> list[Path]:
    found = []
    for top in PACKAGES:
        found += sorted(p.parent for p in (ROOT / top).rglob("__init__.py")
                        if "starter" not in p.parts and "solution" not in p.parts)
    return found


def layout_markdown() -> str:
    out = []
    for pkg in packages():
        rel = pkg.relative_to(ROOT).as_posix()
        doc = ast.get_docstring(ast.parse((pkg / "__init__.py").read_text()))
        out += [f"## `{rel}/`", ""]
        if doc:
            out += [first_paragraph(doc), ""]
        modules = sorted(m for m in pkg.glob("*.py") if m.name != "__init__.py")
        if modules:
            out += ["| module | what it holds |", "|---|---|"]
            for m in modules:
                line = first_sentence(ast.get_docstring(ast.parse(m.read_text())))
                out.append(f"| `{m.stem}` | {cell(line)} |")
            out.append("")
    return "\n".join(out)


def signature(fn: ast.FunctionDef, drop_self: bool) -> str:
    args = fn.args
    if drop_self and args.args and args.args[0].arg in ("self", "cls"):
        args = ast.arguments(posonlyargs=args.posonlyargs, args=args.args[1:], vararg=args.vararg,
                             kwonlyargs=args.kwonlyargs, kw_defaults=args.kw_defaults,
                             kwarg=args.kwarg, defaults=args.defaults)
    ret = f" -> {ast.unparse(fn.returns)}" if fn.returns else ""
    return f"({ast.unparse(args)}){ret}"


def docstring_markdown(doc: str | None) -> list[str]:
    if not doc:
        return []
    # Docstrings are plain text: keep their paragraphs, and their indented lines as they are.
    return ["\n".join(line.rstrip() for line in doc.strip().splitlines()), ""]


def find(module: str, name: str) -> tuple[ast.AST, list[str]]:
    """The class or function `name` of `module`, and the module's source lines."""
    source = (ROOT / (module.replace(".", "/") + ".py")).read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef) and node.name == name:
            return node, source.splitlines()
    raise LookupError(f"docs: {module} has no top-level {name} (named in an <!-- api --> marker)")


def dataclass_fields(node: ast.ClassDef, lines: list[str]) -> list[str]:
    """A dataclass's constructor, one field a line, with the comment its source gives it."""
    fields = []
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            text = f"    {item.target.id}: {ast.unparse(item.annotation)}"
            if item.value is not None:
                text += f" = {ast.unparse(item.value)}"
            comment = lines[item.lineno - 1].partition("  # ")[2]
            fields.append(f"{text},{'  # ' + comment if comment else ''}")
    return fields


def api_markdown(module: str, name: str) -> str:
    node, lines = find(module, name)
    out = [f"## `{name}`", "", f"`from {module} import {name}`", ""]
    if isinstance(node, ast.FunctionDef):
        out += ["```python", f"{name}{signature(node, False)}", "```", ""]
        out += docstring_markdown(ast.get_docstring(node))
        return "\n".join(out)
    out += docstring_markdown(ast.get_docstring(node))
    methods = [n for n in node.body if isinstance(n, ast.FunctionDef)]
    init = next((m for m in methods if m.name == "__init__"), None)
    if init:
        out += ["```python", f"{name}{signature(init, True)}", "```", ""]
    elif fields := dataclass_fields(node, lines):
        out += ["```python", f"{name}(", *fields, ")", "```", ""]
    for m in methods:
        if m.name.startswith("_"):
            continue
        prop = any(isinstance(d, ast.Name) and d.id == "property" for d in m.decorator_list)
        out += [f"### `{name}.{m.name}`", "", "```python"]
        out += [f"{m.name}: {ast.unparse(m.returns)}" if prop and m.returns else
                m.name if prop else f"{m.name}{signature(m, True)}", "```", ""]
        out += docstring_markdown(ast.get_docstring(m))
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:  # MkDocs' hook signature
    markdown = LAYOUT.sub(lambda _: layout_markdown(), markdown)
    return API.sub(lambda m: api_markdown(m.group(1), m.group(2)), markdown)


def on_config(config):
    """Put each OPTIONAL_PAGES file that exists into the navigation, unless mkdocs.yml already has it."""
    named = repr(config["nav"])
    for name, (section, title, after) in OPTIONAL_PAGES.items():
        if not (Path(config["docs_dir"]) / name).exists() or f"'{name}'" in named:
            continue
        for entry in config["nav"]:
            if isinstance(entry, dict) and section in entry:
                pages = entry[section]
                where = next((i + 1 for i, p in enumerate(pages) if isinstance(p, dict) and after in p), len(pages))
                pages.insert(where, {title: name})
    return config
