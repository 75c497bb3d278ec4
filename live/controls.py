"""The switches the live view offers, checked before anything touches the fabric.

A request from the page (JSON) or a key in the terminal becomes a `Control`; anything wrong with it
raises `ControlError` with an HTTP status and a sentence saying what to send instead, so that a bad
request changes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from topologies import Topology
from transport.core.config import PATH_POLICIES

MODES = ("ecmp", "spray", "single")  # routing modes of the controller offered live
POLICIES = PATH_POLICIES  # the transport's path policies
KINDS = ("mode", "policy", "link", "loss")


class ControlError(Exception):
    """A control that cannot be applied; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Control:
    kind: str  # one of KINDS
    mode: str | None = None
    policy: str | None = None
    link: str | None = None  # a topology link name (a-b as the topology spells it)
    up: bool | None = None
    loss_pct: float | None = None

    def describe(self) -> str:
        if self.kind == "mode":
            return f"routing mode {self.mode}"
        if self.kind == "policy":
            return f"path policy {self.policy}"
        if self.kind == "link":
            return f"{'restore' if self.up else 'cut'} {self.link}"
        return f"loss {self.loss_pct:g} % on {self.link}"


def resolve_link(topo: Topology, name: Any) -> str:
    """A link name as the topology spells it; 'spine1-leaf1' finds 'leaf1-spine1' too."""
    if not isinstance(name, str) or not name:
        raise ControlError(400, 'give the link by name, e.g. {"link": "leaf1-spine1"}')
    names = {lk.name for lk in topo.links}
    if name in names:
        return name
    a, sep, b = name.partition("-")
    if sep:
        found = topo.links_between(a, b) if a and b else []
        if found:
            return found[0].name
    example = next(iter(sorted(names)), "a-b")
    raise ControlError(404, f"no link {name!r} in {topo.name}; links are named like {example!r}")


def _choice(body: dict[str, Any], key: str, choices: tuple[str, ...]) -> str:
    value = body.get(key)
    if value not in choices:
        raise ControlError(400, f"unknown {key} {value!r}; choose one of {', '.join(choices)}")
    return value


def parse(kind: str, body: Any, topo: Topology, policies: tuple[str, ...] = POLICIES) -> Control:
    """The control for a JSON body sent to /api/<kind>; `policies`: those the session offers."""
    if kind not in KINDS:
        raise ControlError(404, f"no control {kind!r}; there are {', '.join(KINDS)}")
    if not isinstance(body, dict):
        raise ControlError(400, "the body must be a JSON object, e.g. " + EXAMPLES[kind])
    if kind == "mode":
        return Control("mode", mode=_choice(body, "mode", MODES))
    if kind == "policy":
        return Control("policy", policy=_choice(body, "policy", policies))
    link = resolve_link(topo, body.get("link"))
    if kind == "link":
        up = body.get("up")
        if not isinstance(up, bool):
            raise ControlError(400, 'give "up": true to restore the link or false to cut it')
        return Control("link", link=link, up=up)
    pct = body.get("loss_pct")
    if isinstance(pct, bool) or not isinstance(pct, int | float) or not math.isfinite(pct):
        raise ControlError(400, 'give "loss_pct" as a number of percent, e.g. 1.5')
    if not 0 <= pct <= 100:
        raise ControlError(400, f"loss {pct:g} % is outside 0-100")
    return Control("loss", link=link, loss_pct=float(pct))


EXAMPLES = {
    "mode": '{"mode": "spray"}',
    "policy": '{"policy": "spray"}',
    "link": '{"link": "leaf1-spine1", "up": false}',
    "loss": '{"link": "leaf1-spine1", "loss_pct": 1}',
}
