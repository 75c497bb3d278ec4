"""Kinds of arm: how an arm's traffic is carried (`srd`, `tcp`, `allreduce`, `ping`), one module each.

`get(kind)` gives the `ArmKind` that starts the arm's endpoints in the fabric (`start`), turns what
they wrote into the arm's flows (`parse`), says in a few words what the arm runs (`describe`) and what
the results may expect of it (`point_to_point`, `reports_reordering`, ...). Every module of this
package is imported here, and each kind registers itself, so a new kind is one new module.
"""

from __future__ import annotations

import importlib
import pkgutil

from experiments.arms.base import ArmContext, ArmKind, Flow, describe, get, names

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["ArmContext", "ArmKind", "Flow", "describe", "get", "names"]
