"""The labs' commands: `fabriclab labs` (the list) and `fabriclab lab check N [DIR]` (run lab N's checker on DIR)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cli.args import show_help
from labs.catalogue import LabError, all_labs, find_lab, load_checker

USER_ERRORS = (LabError,)


def register(commands: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    p = commands.add_parser("labs", help="list the teaching labs",
                            description="List the teaching labs (labs/NN-name/ in the source tree): number, "
                            "title, folder and what each is about. Start with the lab's README.md.")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(func=cmd_labs)

    lab = commands.add_parser("lab", help="work with one lab: `fabriclab lab check N [DIR]`",
                              description="Commands for one lab.")
    lab.set_defaults(func=show_help(lab))
    lab_sub = lab.add_subparsers(dest="lab_command", metavar="WHAT")
    c = lab_sub.add_parser(
        "check", help="grade a lab: PASS/FAIL per check with the reason",
        description="Run lab N's checker on DIR and print PASS or FAIL for every check with its reason. "
        "DIR is a results directory written by `fabriclab run` (a run's folder, or the --out root: the "
        "newest run of the lab's experiment is graded), or a folder of lab code (the lab's starter/, "
        "solution/ or your copy). Exit 0 when every check passed, 1 when one failed, 2 on bad input.")
    c.add_argument("number", type=_lab_number, metavar="N", help="lab number (see `fabriclab labs`)")
    c.add_argument("dir", nargs="?", type=Path, default=Path("results"), metavar="DIR",
                   help="what to grade (default: ./results)")
    c.add_argument("--seed", type=int, default=None, metavar="S",
                   help="draw the checker's random cases from S (it prints the seed it used; give it again to "
                   "repeat a run's cases)")
    c.set_defaults(func=cmd_check)


def _lab_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a lab number; use e.g. 1 (see `fabriclab labs`)") from None


def cmd_labs(args: argparse.Namespace) -> int:
    labs = all_labs()
    if args.json:
        print(json.dumps([{"number": lab.number, "title": lab.title, "path": str(lab.path),
                           "summary": lab.summary} for lab in labs], indent=1))
        return 0
    for lab in labs:
        print(f"{lab.number:>2}  {lab.title}\n    {lab.path}\n    {lab.summary}\n")
    print("Open a lab's README.md to start; grade with `fabriclab lab check N [DIR]`.")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from labs import grading

    target: Path = args.dir
    lab = find_lab(args.number)
    if not target.exists():
        raise LabError(f"{target} does not exist; give a results directory or a folder of lab code")
    checker = load_checker(lab)
    seed = grading.use_seed(args.seed)
    print(f"lab {lab.number}: {lab.title}\nchecking {target}\n"
          f"random cases drawn with seed {seed} (`--seed {seed}` draws the same again)\n")
    text, code = grading.render(checker.check(target))
    print(text)
    return code
