"""`fabriclab live --path-policy FILE.py:ClassName`: the view starts with the user's policy, offers it
beside the built-ins on the page and in the terminal, and refuses a bad one in one line."""

from __future__ import annotations

import pytest

from live import controls
from live.backend import FakeBackend
from live.controls import ControlError
from live.session import LiveSession
from live.tui import KeyInput
from tests.live.conftest import SPEC, run
from tests.live.test_api import live, post
from topologies import parse_spec

TOPO = parse_spec(SPEC)
MINE = "/abs/labs/my_policy.py:MyPolicy"


def test_controls_accept_only_the_policies_offered():
    with pytest.raises(ControlError, match="choose one of single, spray, adaptive"):
        controls.parse("policy", {"policy": MINE}, TOPO)
    c = controls.parse("policy", {"policy": MINE}, TOPO, (*controls.POLICIES, MINE))
    assert c.policy == MINE


def test_the_session_offers_the_users_policy_and_switches_to_and_from_it():
    async def body():
        async with live(FakeBackend(TOPO, policy=MINE)) as (client, _session, backend):
            st = await (await client.get("/api/state")).json()
            assert st["policy"] == MINE and st["policies"] == ["single", "spray", "adaptive", MINE]
            assert (await post(client, "policy", {"policy": "spray"}))[0] == 200
            status, out = await post(client, "policy", {"policy": MINE})
            assert status == 200 and out["policy"] == MINE
            assert backend.calls == [("set_policy", ("spray",)), ("set_policy", (MINE,))]
            assert (await post(client, "policy", {"policy": "/other.py:X"}))[0] == 400

    run(body)


def test_without_a_plugin_the_choices_are_the_builtins():
    assert LiveSession(FakeBackend(TOPO)).policies == controls.POLICIES


def test_the_terminal_cycles_through_the_users_policy_too():
    keys = KeyInput(["leaf1-spine1"], policy="adaptive", policies=(*controls.POLICIES, MINE))
    assert keys.feed("p") == ("policy", {"policy": MINE})
    keys.policy = MINE
    assert keys.feed("p") == ("policy", {"policy": "single"})


def test_the_page_adds_a_button_for_the_users_policy():
    from importlib import resources

    js = resources.files("live").joinpath("static/app.js").read_text()
    assert "addPolicyButtons(msg.policies)" in js and "policyLabel(msg.policy)" in js


@pytest.mark.parametrize(("spec", "words"), [("missing.py:X", "does not exist"), ("nope", "is not FILE.py:ClassName")])
def test_live_refuses_a_bad_policy_in_one_line(spec, words, capsys):
    from cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main(["live", "--fake", "--path-policy", spec])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1
