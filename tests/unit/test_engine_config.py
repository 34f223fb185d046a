"""What the step engine is told of a job comes from its plan where the plan decides:
``schedule: auto`` that resolves to varuna runs Varuna's opportunistic order."""

from __future__ import annotations

import pytest

from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.worker.assembly import engine_config

from ..jobrun import tiny_spec


@pytest.mark.parametrize(
    ("asked", "resolved", "opportunistic"),
    [("varuna", "varuna", True), ("auto", "varuna", True), ("auto", "1f1b", False)],
)
def test_opportunistic_order_follows_the_plans_schedule(asked, resolved, opportunistic):
    spec = tiny_spec(**{"parallelism.schedule": asked})
    plan = make_plan(spec).model_copy(update={"schedule": resolved})
    assert engine_config(spec, plan).opportunistic is opportunistic


def test_a_varuna_spec_plans_varuna():
    # What the first case assumes of the planner: an explicit schedule is honoured.
    spec = tiny_spec(**{"parallelism.schedule": "varuna"})
    assert make_plan(spec).schedule == "varuna"
