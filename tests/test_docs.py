"""The documentation site keeps its promises: it builds strictly (no broken link or anchor, no page left
out of the navigation), its generated pages come from the code, and its commands and tables say what
the code does: the wire format, the commands, the experiments' fabrics and arms, results.json's keys,
the live view's options and the Vagrant path the README gives."""

from __future__ import annotations

import argparse
import os
import re
import struct
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

import pytest

from transport.core.wire import ACK_FIELDS, CTRL_FIELDS, DATA_FIELDS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MKDOCS = Path(sys.executable).parent / "mkdocs"


def page(name: str) -> str:
    """The text of a page of the site, `name` relative to docs/ (e.g. "emulator.md")."""
    return (DOCS / name).read_text()


def flat(text: str) -> str:
    """Text with every run of whitespace as one space: a sentence found whatever its line breaks."""
    return " ".join(text.split())


@cache
def parser() -> argparse.ArgumentParser:
    from cli.main import build_parser

    return build_parser()


def subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def cli_commands() -> set[str]:
    """Every command a person types: `doctor`, `bench cc`, `srd send`, `lab check`, ..."""
    found = set()
    for name, sub in subcommands(parser()).items():
        subs = subcommands(sub)
        found |= {f"{name} {s}" for s in subs} if subs else {name}
    return found


def table_commands(text: str) -> list[str]:
    """The commands a table's first column names: each `fabriclab ...` in its first cell."""
    rows = [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| `fabriclab")]
    return [c for row in rows for c in re.findall(r"`fabriclab ([^`]*)`", row)]


def resolve(words: str) -> str | None:
    """`bench cc [--quick]`, `srd recv/send/group ...` -> the command it names, or None."""
    tokens = [t for t in words.split() if re.fullmatch(r"[a-z][a-z-]*(/[a-z-]+)*", t)]
    if not tokens:
        return None
    first, *rest = tokens
    subs = subcommands(subcommands(parser()).get(first, argparse.ArgumentParser()))
    if first not in subcommands(parser()):
        return None
    if not subs:
        return first
    if not rest or not all(s in subs for s in rest[0].split("/")):
        return None
    return f"{first} {rest[0].split('/')[0]}"


def options_of(command: str) -> set[str]:
    """Every option string of a command `resolve` named: `up`, `bench cc`, ..."""
    sub = subcommands(parser())[command.split()[0]]
    if " " in command:
        sub = subcommands(sub)[command.split()[1]]
    return {o for action in sub._actions for o in action.option_strings}


def written_options(span: str) -> set[str]:
    return set(re.findall(r"(--[a-z][a-z-]*)", span))


@cache
def docs_hooks():
    """scripts/docs_hooks.py, the site's hook, as a module."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import docs_hooks as hooks
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return hooks


# ---------------------------------------------------------------------------------------------------
# The site


def test_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`, as `make docs` runs it: a broken link or anchor, a page missing from the
    nav, or a generated page whose object is gone fails the build."""
    assert MKDOCS.exists(), f"{MKDOCS} is missing: make setup installs it (pyproject.toml's test extra)"
    started = time.monotonic()
    proc = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0 and "WARNING" not in proc.stderr, proc.stdout + proc.stderr
    assert time.monotonic() - started < 60
    layout = (tmp_path / "site" / "layout.html").read_text()
    for init in (ROOT / "transport").rglob("__init__.py"):
        assert init.parent.relative_to(ROOT).as_posix() + "/" in layout
    api = (tmp_path / "site" / "api.html").read_text()
    for name in ("Fabric", "parse_spec", "Connection", "receive_datagram", "datagrams_to_send"):
        assert name in api, name
    # A page written beside the others (scripts/docs_hooks.py's OPTIONAL_PAGES) is in the nav once it exists.
    home = (tmp_path / "site" / "index.html").read_text()
    for name in docs_hooks().OPTIONAL_PAGES:
        assert ((DOCS / name).exists()) == (f'href="{name[:-3]}.html"' in home), name


def test_make_docs_builds_the_site_strictly():
    make = subprocess.run(["make", "-s", "-n", "docs"], cwd=ROOT, capture_output=True, text=True)
    assert "mkdocs build --strict" in make.stdout, make.stdout + make.stderr


def test_the_layout_page_is_generated_not_written():
    text = page("layout.md")
    assert "<!-- layout -->" in text and "| module |" not in text
    generated = docs_hooks().layout_markdown()
    for top in docs_hooks().PACKAGES:
        for module in (ROOT / top).rglob("*.py"):
            if {"starter", "solution"} & set(module.parts) or module.name == "__init__.py":
                continue
            if (module.parent / "__init__.py").exists():
                assert f"| `{module.stem}` |" in generated, module


# ---------------------------------------------------------------------------------------------------
# Commands and tables true to the code


def test_wire_format_tables_match_the_code():
    """The wire format is written once, in docs/transport.md, from the code's field tables."""
    doc = page("transport.md")
    for fields in (DATA_FIELDS, ACK_FIELDS, CTRL_FIELDS):
        for name, code, desc in fields:
            assert f"| `{name}` | {struct.calcsize('!' + code) * 8} | {desc} |" in doc, name
    readme = (ROOT / "README.md").read_text()
    assert "| `psn` |" not in readme and "| `cum_psn` |" not in readme, "the wire format is in docs/transport.md only"


def test_commands_page_names_every_command_and_only_real_ones():
    named = table_commands(page("commands.md"))
    resolved = {resolve(c) for c in named}
    assert None not in resolved, [c for c in named if resolve(c) is None]
    # `srd recv/send/group` names the three srd commands in one row.
    resolved |= {f"srd {s}" for s in subcommands(subcommands(parser())["srd"])}
    missing = cli_commands() - resolved
    assert not missing, f"docs/commands.md does not describe {sorted(missing)}: add a row to its table"


def test_commands_page_options_are_real_options():
    """Every --option written beside a command in the commands table is one that command takes."""
    for span in table_commands(page("commands.md")):
        command = resolve(span)
        assert written_options(span) <= options_of(command), f"fabriclab {span}"


def test_readme_command_table_is_one_line_per_real_command():
    readme = (ROOT / "README.md").read_text()
    named = table_commands(readme)
    resolved = {resolve(c) for c in named}
    assert None not in resolved, [c for c in named if resolve(c) is None]
    resolved |= {f"srd {s}" for s in subcommands(subcommands(parser())["srd"])}
    missing = cli_commands() - resolved
    assert not missing, f"README.md's Commands table has no line for {sorted(missing)}: add one (one line each)"


def test_every_experiment_has_its_page_with_its_fabric_and_arms():
    from experiments.catalogue import CATALOGUE

    pages = {p.stem for p in (DOCS / "experiments").glob("*.md")}
    assert pages == set(CATALOGUE), f"pages without experiment {pages - set(CATALOGUE)}, " \
        f"experiments without page {set(CATALOGUE) - pages}"
    overview = page("experiments.md")
    for name, entry in CATALOGUE.items():
        exp = entry.build()
        text = page(f"experiments/{name}.md")
        assert f"| `{exp.topology}` |" in text, f"{name}: default fabric is {exp.topology}"
        for arm in exp.arms:
            assert f"`{arm.name}`" in text, f"{name}: arm {arm.name}"
        assert f"| {exp.duration_s:g} |" in text, f"{name}: {exp.duration_s} s per arm"
        assert f"fabriclab run {name}" in text
        assert f"[`{name}`](experiments/{name}.md)" in overview, name
        written = set(re.findall(r"`(--[a-z][a-z-]*)", text))
        assert written <= options_of("run"), f"{name}: {sorted(written - options_of('run'))}"


def test_results_reference_names_only_real_keys():
    from experiments.schema import ResultsDocument

    keys = set(ResultsDocument.__required_keys__) | set(ResultsDocument.__optional_keys__)
    rows = [line.split(" | ")[0] for line in page("results.md").splitlines() if line.startswith("| `")]
    named = {k for row in rows for k in re.findall(r"`([a-z_]+)`", row)}
    assert named, "docs/results.md has no key table"
    assert named - {"arms"} <= keys, sorted(named - keys)
    assert "arms" in keys


def test_topology_keys_table_is_every_builder_s_keys():
    """docs/topologies.md's table of spec keys, builder by builder, against what parse_spec accepts."""
    from topologies import parse_spec
    from topologies.spec import SpecError

    table = page("topologies.md").split("| builder | key | meaning | default |", 1)[1].split("\n\n", 1)[0]
    documented: dict[str, set[str]] = {}
    builder = ""
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        builder = cells[0] or builder
        documented.setdefault(builder, set()).update(re.findall(r"`([a-z_]+)`", cells[1]))
    common = documented.pop("every builder")
    assert documented
    for name, keys in documented.items():
        with pytest.raises(SpecError) as err:
            parse_spec(f"{name}:zz_not_a_key=1")
        known = set(re.search(r"known keys: (.*)$", str(err.value)).group(1).split(", "))
        assert keys | common == known, f"{name}: documented {sorted(keys | common)}, accepted {sorted(known)}"


def first_column_names(text: str, header: str) -> set[str]:
    """The backquoted names in the first column of the table whose header row is `header`."""
    table = text.split(header, 1)[1].split("\n\n", 1)[0]
    return {n for row in table.splitlines()[2:] for n in re.findall(r"`([a-z-]+)`", row.split(" | ")[0])}


def test_controller_modes_table_is_the_routing_modes():
    from transport.core.contract import ROUTING_MODES

    assert first_column_names(page("controller.md"), "| mode | rule |") == set(ROUTING_MODES)


def test_collectives_table_is_what_allreduce_runs():
    allreduce = subcommands(parser())["allreduce"]
    (choices,) = [a.choices for a in allreduce._actions if "--collective" in a.option_strings]
    documented = first_column_names(page("transport-guide.md"), "| collective | schedule |")
    assert documented == set(choices), (sorted(documented), sorted(choices))


def test_labs_page_lists_every_lab():
    from labs.catalogue import all_labs

    text = page("labs.md")
    labs = all_labs()
    words = ["One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine", "Ten"]
    assert text.split("\n\n")[1].startswith(f"{words[len(labs) - 1]} teaching labs"), "the count of labs"
    for lab in labs:
        assert f"| {lab.number} " in text and f"(`labs/{lab.slug}/`)" in text, lab.slug


def test_live_options_table_names_real_options():
    live = subcommands(parser())["live"]
    options = {s for action in live._actions for s in action.option_strings}
    text = page("live.md")
    table = text.split("| option | meaning |", 1)[1].split("\n\n", 1)[0]
    first_cells = [row.split(" | ")[0] for row in table.splitlines() if row.startswith("| `")]
    named = {o for cell in first_cells for o in re.findall(r"`(--[a-z-]+)", cell)}
    assert named and named <= options, sorted(named - options)


def test_measurements_are_a_log_of_dated_reproducible_entries():
    """One section per benchmark; each entry says when, at which commit, on which machine and with which
    command; a section's first entry is its latest, and the table at the top lists every section."""
    text = page("measurements.md")
    entry = re.compile(r"^\*([^*]+?) · (?:commit [0-9a-f]{7,40}|recorded in commits [^·]+)"
                       r" · ([^*]+)\* — reproduce with: \S", re.M)
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    benchmarks = [s for s in sections if not s.startswith(("Latest entries", "Machines"))]
    assert len(benchmarks) >= 8
    latest = text.split("## Latest entries", 1)[1].split("\n## ", 1)[0]
    for section in benchmarks:
        title = section.splitlines()[0]
        first = section.split("\n### ", 1)[1]
        assert first.startswith("Latest"), f"{title}: the first entry is not the latest"
        assert entry.search(first.split("\n### ", 1)[0]), f"{title}: its latest entry lacks date, commit or command"
        for sub in section.split("\n### ")[1:]:
            assert entry.search(sub), f"{title} / {sub.splitlines()[0]}: no date, commit, machine and command"
        assert f"[{title}](#" in latest, f"{title} is not in the table of latest entries"
    assert "(docs/measurements.md#latest-entries)" in (ROOT / "README.md").read_text()
    # The commands the entries give to reproduce them are commands, with options, of today's fabriclab.
    for line in (m.group(0) for m in re.finditer(r"^\*.* — reproduce with: .*$", text, re.M)):
        for span in re.findall(r"`(?:[A-Z_]+=\S+ )?fabriclab ([^`]*)`", line):
            command = resolve(span)
            assert command and written_options(span) <= options_of(command), line


# ---------------------------------------------------------------------------------------------------
# What the README and the site both say, said alike


def fenced(text: str, after: str) -> str:
    m = re.search(re.escape(after) + r".*?```[a-z]*\n(.*?)```", text, re.S)
    assert m, after
    return m.group(1)


def test_the_demo_output_on_the_home_page_is_the_readme_s():
    readme = (ROOT / "README.md").read_text()
    what = "What it printed here"
    assert fenced(readme, what) == fenced(page("index.md"), what)


def test_the_vagrant_commands_on_the_vm_page_are_the_readme_s():
    """The README's block is the one `make vagrant-test` runs; the VM page shows the same."""
    marker = "<!-- vagrant-test"
    assert fenced((ROOT / "README.md").read_text(), marker) == fenced(page("vm.md"), marker)


def test_pages_name_no_readme_section_that_is_gone():
    for path in DOCS.rglob("*.md"):
        assert "README.md#" not in path.read_text(), path

