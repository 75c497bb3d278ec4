"""`fabriclab run NAME --path-policy FILE.py:ClassName`: the experiment plus one arm running your policy.

The added arm is a copy of the experiment's sprayed transport arm — the first transport arm routed in
`spray` mode, else the first whose policy sprays — with your policy in place of its own and everything
else the same (routing mode, recovery, delivery, faults, workload), named after your class. The table,
summary and plots then compare your policy with the experiment's own arms on the same fabric, seed and
faults. Experiments without a transport arm (in-server, allreduce) cannot take a policy: one line, exit 2.

A policy that broke while running (transport.core.policy_plugin's guard) is named in the summary sentences,
with the flows it broke in: the run itself went on with spray.
"""

from __future__ import annotations

from dataclasses import replace

from experiments.model import Arm, Experiment
from experiments.schema import ResultsDocument, arm_label
from transport.core.policy_plugin import label


class PolicyArmError(ValueError):
    """The experiment has no arm a path policy could run in."""


def template_arm(exp: Experiment) -> Arm:
    """The arm whose settings the user's policy runs with."""
    srd = [a for a in exp.arms if a.kind == "srd"]
    for arm in srd:
        if arm.mode == "spray":
            return arm
    for arm in srd:
        if arm.policy in ("spray", "adaptive"):
            return arm
    if srd:
        return srd[0]
    raise PolicyArmError(f"{exp.name} has no transport arm to run a path policy in (its arms: "
                         f"{', '.join(a.name for a in exp.arms)}); use ecmp-vs-spray, hot-link, failover, "
                         "reordering or loss-recovery")


def with_policy_arm(exp: Experiment, policy: str) -> Experiment:
    """`exp` with one more arm: the template arm running `policy` (a checked plug-in spec)."""
    base = template_arm(exp)
    names = {a.name for a in exp.arms}
    name = label(policy)
    if name in names:
        name = f"{name}-plugin"
    arm = replace(base, name=name, policy=policy, labels={**base.labels, "path_policy": name, "like": base.name})
    return replace(exp, arms=[*exp.arms, arm])


def fault_sentences(doc: ResultsDocument) -> list[str]:
    """One sentence per arm whose plug-in policy broke: which flows, and the first fault's words."""
    out = []
    for a in doc.get("arms", []):
        faults = [f.get("path_policy_fault") for f in a.get("flows", []) if f.get("path_policy_fault")]
        if faults:
            out.append(f"{arm_label(a)}: the path policy broke in {len(faults)} of {len(a['flows'])} flow(s), which "
                       f"went on with spray: {faults[0]}.")
    return out
