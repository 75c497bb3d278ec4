"""The shell steps of a lab README, and how the tests shrink them to smoke size.

A lab's steps are its fenced ```sh / ```bash blocks, run in order from the root of a clone. The
tests run them as written except for the size flags below, so a README cannot drift from what works.
Every long-running command must carry its size flag: a new step without one would run at full size in
CI, so it is reported instead of run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```(sh|bash|shell)\s*$")
# flag -> value at smoke size
SMOKE_SIZE = {"--duration": "3", "--repetitions": "1", "--packets": "200", "--iterations": "2",
              "--bytes": "256K", "--trials": "200"}
# commands that run until a size says stop, and the flag that must say it
NEEDS_SIZE = {("fabriclab", "run"): "--duration", ("fabriclab", "demo"): "--duration",
              ("fabriclab", "live"): "--duration", ("fabriclab", "probe"): "--packets"}


@dataclass(frozen=True)
class Block:
    readme: Path
    line: int
    text: str

    def where(self) -> str:
        return f"{self.readme.parent.name}/README.md line {self.line}"


def blocks(readme: Path) -> list[Block]:
    out, current, start = [], None, 0
    for n, line in enumerate(readme.read_text().splitlines(), 1):
        if current is None:
            if FENCE.match(line.strip()):
                current, start = [], n + 1
        elif line.strip() == "```":
            out.append(Block(readme, start, "\n".join(current)))
            current = None
        else:
            current.append(line)
    return out


def commands(text: str) -> list[str]:
    """Logical command lines: continuations joined, comments and blanks dropped."""
    joined = re.sub(r"\s*\\\n\s*", " ", text)
    return [c.strip() for c in joined.splitlines() if c.strip() and not c.strip().startswith("#")]


def missing_size(command: str) -> str | None:
    words = command.split()
    for (prog, sub), flag in NEEDS_SIZE.items():
        for i, w in enumerate(words[:-1]):
            if w == prog and words[i + 1] == sub and flag not in words:
                return f"`{command}` has no {flag}"
    return None


def smoke(command: str) -> str:
    for flag, value in SMOKE_SIZE.items():
        command = re.sub(rf"({re.escape(flag)})(=|\s+)\S+", rf"\g<1>\g<2>{value}", command)
    # A checker grades the smoke run's numbers, which are too small to be judged: it must run and give
    # its verdict (exit 0 PASS or 1 FAIL), not crash or refuse its input (exit 2).
    if re.search(r"\bfabriclab lab check\b", command):
        command = f"rc=0; {command} || rc=$?; test $rc -le 1"
    return command


def smoke_script(block: Block) -> str:
    return "set -euo pipefail\n" + "\n".join(smoke(c) for c in commands(block.text)) + "\n"
