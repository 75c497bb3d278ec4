"""The README keeps its promises: short, the two commands on the first screen, a picture, links that
lead somewhere, and `.ci/run` calling `make test`. Its command table is checked against the parser, and
the wire format (now in docs/transport.md only), with the rest of the site, in test_docs.py."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_first_screen_shows_the_two_commands():
    first_screen = "\n".join(README.splitlines()[:40])
    assert "make demo" in first_screen and "make test" in first_screen


def test_short_enough_to_read():
    lines = README.splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/"
    long = [n for n, line in enumerate(lines, 1) if len(line) > 300]
    assert not long, f"lines over 300 characters: {long}"


def test_shows_a_picture_that_exists():
    pictures = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", README)
    assert pictures, "README.md shows no picture"
    for picture in pictures:
        assert (ROOT / picture).is_file(), picture


def test_links_lead_somewhere():
    """Every relative link names a file of the project; every #anchor a heading of the README."""
    headings = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-")
                for h in re.findall(r"^#+ (.+)$", README, re.M)}
    for target in re.findall(r"\]\(([^)]+)\)", README):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        if path:
            assert (ROOT / path).exists(), target
        else:
            assert anchor in headings, target


def test_points_to_the_docs_and_the_latest_measurements():
    for page in ("docs/getting-started.md", "docs/commands.md", "docs/experiments.md",
                 "docs/measurements.md#latest-entries"):
        assert f"]({page})" in README, page


def test_ci_runs_make_test():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
