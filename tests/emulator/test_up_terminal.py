"""`fabriclab up` in a terminal, as the docs tell a person to use it: the Mininet CLI session that
docs/emulator.md shows, replayed line by line; the transport commands of docs/transport-guide.md typed
into emulated hosts from that CLI; Ctrl-C on a fabric held up; and the terminal closed under it. Each
ends with nothing left on the machine."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from tests.emulator_helpers import assert_no_leftovers, new_leftovers
from tests.terminal import FABRICLAB, Terminal, terminal
from tests.test_docs import page

SESSION_DOC = page("emulator.md")
TRANSPORT_DOC = page("transport-guide.md")

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(180)]

PROMPT = "mininet> "
SMALL = "leaf-spine:spines=2,leaves=2,hosts=2,rate=10"
# What differs from run to run in the documented session: timings, the controller's port, the rates, the
# ping times, and the datapath (the VM's kernel has the openvswitch module; this machine's does not).
VOLATILE = re.compile(r"up in [\d.]+ s|127\.0\.0\.1:\d+|time=[\d.]+ ms|time \d+ms|= [\d./]+ ms"
                      r"|'[\d.]+ [KMG]?bits/sec'|\w+ datapath \([\w-]+ switch daemons\)")


def readme_session() -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The documented `fabriclab up --cli` session (docs/emulator.md): the command line, then (typed
    line, lines printed) pairs, the first typed line "" for what `up` prints before the first prompt."""
    block = re.search(r"```console\n(\$ sudo \.venv/bin/fabriclab up [^\n]*--cli\n.*?)```", SESSION_DOC, re.S)
    assert block, "docs/emulator.md shows no `fabriclab up ... --cli` session"
    first, *lines = block.group(1).splitlines()
    argv = shlex.split(first[2:])
    assert argv[:2] == ["sudo", ".venv/bin/fabriclab"]
    steps: list[tuple[str, list[str]]] = [("", [])]
    for line in lines:
        if line.startswith(PROMPT):
            steps.append((line[len(PROMPT):], []))
        else:
            steps[-1][1].append(line)
    return [FABRICLAB, *argv[2:]], steps


def line_pattern(line: str) -> re.Pattern[str]:
    """A documented line as a regex: literal, except where it shows something volatile."""
    return re.compile(f"(?:{VOLATILE.pattern})".join(re.escape(part) for part in VOLATILE.split(line)))


def assert_lines(shown: list[str], expected: list[str], what: str) -> None:
    shown = [s.rstrip() for s in shown]
    assert len(shown) == len(expected), f"{what}: the docs show\n" + "\n".join(expected) + \
        "\n--- the terminal showed\n" + "\n".join(shown)
    for got, want in zip(shown, expected, strict=True):
        assert line_pattern(want.rstrip()).fullmatch(got), f"{what}: documented line {want!r}, terminal {got!r}"


def host_table(text: str) -> dict[str, str]:
    """Host name -> address, from the table `up` prints."""
    return dict(re.findall(r"^  (h\d+) +(\d+\.\d+\.\d+\.\d+) ", text, re.M))


def type_line(term: Terminal, line: str, timeout: float = 60) -> list[str]:
    """Type a line at the Mininet prompt; the lines it printed before the next prompt."""
    start = len(term.text)
    term.child.sendline(line)
    prompt = term.wait_for(re.escape(PROMPT), timeout, since=start + len(line))
    echoed, *shown = term.text[start:prompt.start()].split("\n")
    assert echoed.strip() == line, f"the terminal echoed {echoed!r} for {line!r}"
    return shown[:-1] if shown and shown[-1] == "" else shown


def test_the_readme_cli_session_in_a_terminal(tmp_path):
    argv, steps = readme_session()
    typed = [line for line, _ in steps[1:]]
    assert typed[:2] == ["pingall", "h1 ping -c 1 10.0.0.4"] and "nodes" in typed and "iperf h1 h4" in typed
    assert typed[-1] == "exit" and steps[-1][1] == ["fabric torn down"]
    with terminal(argv, cwd=tmp_path) as term:
        first = term.wait_for(re.escape(PROMPT), 120)
        assert_lines(term.text[:first.start()].rstrip("\n").split("\n"), steps[0][1], "`up` before the prompt")
        hosts = host_table(term.text)
        for line, expected in steps[1:-1]:
            if line.startswith("h1 ping"):
                line = f"h1 ping -c 1 {hosts['h4']}"  # h4's address as the table printed it
            shown = type_line(term, line)
            assert_lines(shown, expected, f"mininet> {line}")
        # The checks the session stands for, spelled out.
        text = term.text
        assert "*** Results: 0% dropped (12/12 received)" in text and "1 received" in text
        assert re.search(r"^h1 h2 h3 h4 leaf1 leaf2 spine1 spine2$", text, re.M)
        assert re.search(r"^\*\*\* Results: \['[\d.]+ Mbits/sec', '[\d.]+ Mbits/sec'\]$", text, re.M)
        start = len(term.text)
        term.child.sendline("exit")
        assert term.exit_status(90) == 0
        assert_lines(term.text[start:].strip("\n").split("\n")[1:], steps[-1][1], "mininet> exit")
    assert_no_leftovers()


# The transport block of docs/transport-guide.md: "inside two emulated hosts (fabriclab up --cli: h8 is 10.0.0.8)".
RECV = "fabriclab srd recv --bind 10.0.0.8 --port 7471 --json-out recv.json"
SEND = "fabriclab srd send --to 10.0.0.8:7471 --bytes 20M --policy spray --json-out send.json"


def test_the_readme_transport_commands_in_hosts_of_the_cli(tmp_path):
    assert RECV in TRANSPORT_DOC and SEND in TRANSPORT_DOC and "h8 fabriclab srd recv" in TRANSPORT_DOC
    with terminal([FABRICLAB, "up", "--cli"], cwd=tmp_path) as term:
        term.wait_for(re.escape(PROMPT), 120)
        assert host_table(term.text)["h8"] == "10.0.0.8"
        type_line(term, f"h8 {RECV} &")
        # 2 MiB instead of 20: the smoke size the labs' steps run at.
        shown = type_line(term, f"h1 {SEND.replace('20M', '2M')}", timeout=90)
        assert any(s.startswith("sent 2097152 bytes") and "(completed)" in s for s in shown), shown
        sent = json.loads((tmp_path / "send.json").read_text())
        assert sent["completed"] and sent["bytes"] == 2097152
        # The receiver still runs in h8: leaving the CLI ends it with the fabric.
        term.child.sendline("exit")
        assert term.exit_status(90) == 0
        assert "fabric torn down" in term.text
    assert_no_leftovers()


def test_ctrl_c_tears_a_held_fabric_down(tmp_path):
    with terminal([FABRICLAB, "up", "--topo", SMALL, "--mode", "spray"], cwd=tmp_path) as term:
        term.wait_for("press Ctrl-C to tear it down", 120)
        term.send("\x03")
        assert term.exit_status(90) == 0
        assert "fabric torn down" in term.text
    assert_no_leftovers()


@pytest.mark.parametrize("cli", [False, True], ids=["held", "cli"])
def test_closing_the_terminal_tears_the_fabric_down(cli, tmp_path):
    """A closed window or a dropped ssh session hangs `up` up (SIGHUP): it tears down as on Ctrl-C."""
    with terminal([FABRICLAB, "up", "--topo", SMALL, *(["--cli"] if cli else [])], cwd=tmp_path) as term:
        term.wait_for(re.escape(PROMPT) if cli else "press Ctrl-C to tear it down", 120)
        assert new_leftovers()["ovs_daemons"]
        assert term.hang_up(90) == 0
    assert_no_leftovers()
