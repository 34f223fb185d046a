"""Mobius as a step system: the planning entry ``core.systems`` loads for ``mobius``.

``core.systems.SYSTEMS`` names this module, and the planner's resolver reaches Mobius
only through it (``core.systems.StepSystem`` is what it offers): ``plan`` plans a
``schedule: mobius`` job (``plan.mobius_plan``), ``resolve`` is ``auto`` turning to
Mobius where no P x D layout fits memory (``step.resolve_mobius``), ``faster`` is
``auto`` turning to it where its simulated step beats the search's plan
(``step.faster_mobius``); ``NAME`` and ``EXPLAIN`` are its lines.
"""

from __future__ import annotations

from jobctl.engine.mobius.planning.plan import mobius_plan as plan
from jobctl.engine.mobius.planning.step import faster_mobius as faster
from jobctl.engine.mobius.planning.step import resolve_mobius as resolve

__all__ = ["EXPLAIN", "NAME", "faster", "plan", "resolve"]

NAME = "Mobius"

EXPLAIN = (
    "a mobius job has no pipeline-schedule simulation to show here: "
    "`jobctl plan` simulates its swaps (mobius.planning.step) and "
    "`jobctl apply` runs it"
)
