"""ZB-V as a job's schedule: the spec's refusals, the planner's V plan (placement,
device lists, simulated step, Gantt by device) and the auto search's V variant."""

from __future__ import annotations

import pytest

from jobctl.engine.calibration.analytic import analytic_calibration
from jobctl.engine.calibration.cache import analytic_fingerprint
from jobctl.engine.core.plan import Plan
from jobctl.engine.planner.resolver import plan_and_simulate
from jobctl.engine.planner.simulator.devices import DeviceSimResult
from jobctl.engine.schedule.placement import parse_placed, stage_lists
from jobctl.engine.schedule.zero_bubble import zb_v
from jobctl.engine.views.gantt import draw_gantt
from jobctl.spec import SpecError, load_spec_text

from ..jobrun import tiny_spec

SPEC = """\
name: zbv
model:
  layers: 4
training:
  global_batch_size: 8
  steps: 5
parallelism:
  pipeline_stages: {P}
  schedule: zb_v
{extra}"""


@pytest.mark.parametrize(
    ("extra", "path", "line", "message", "fix"),
    [
        ("pruning:\n  enabled: true\n  start_step: 1\n  end_step: 4\n  frequency: 1\n",
         "pruning.enabled", 11,
         "does not support pruning", "set parallelism.schedule to zb_h1"),
        ("rebalancing:\n  enabled: true\n", "rebalancing.enabled", 11,
         "does not support rebalancing", "turn off rebalancing.enabled"),
        ("elasticity:\n  enabled: true\n", "elasticity.enabled", 11,
         "an elastic morph", "turn off elasticity.enabled"),
    ],
)  # fmt: skip
def test_zb_v_refusals_name_the_field_line_and_fix(extra, path, line, message, fix) -> None:
    with pytest.raises(SpecError) as info:
        load_spec_text(SPEC.format(P=2, extra=extra), "jobs/zbv.yaml")
    (issue,) = info.value.errors
    assert (issue.path, issue.file, issue.line) == (path, "jobs/zbv.yaml", line)
    assert message in issue.message and fix in issue.fix


def test_zb_v_needs_2p_blocks() -> None:
    with pytest.raises(SpecError) as info:
        load_spec_text(SPEC.format(P=4, extra=""), "jobs/zbv.yaml")
    (issue,) = info.value.errors
    assert issue.path == "parallelism.pipeline_stages" and issue.line == 8
    assert "2P = 8 stages, but it has 6 blocks" in issue.message
    assert "at most 3" in issue.fix


def _cal(spec):
    return analytic_calibration(spec, analytic_fingerprint(spec.hardware, "test"))


def test_planner_plans_zb_v_and_gantt_draws_devices(tmp_path) -> None:
    spec = tiny_spec(**{"parallelism.schedule": "zb_v", "parallelism.data_parallel": 1,
                        "parallelism.recompute": "all"})  # fmt: skip
    plan, sim = plan_and_simulate(spec, calibration=_cal(spec))
    P, M = plan.P, plan.micro_batches
    assert (plan.schedule, P, len(plan.stages)) == ("zb_v", 2, 4)
    assert plan.placement == [[0, 3], [1, 2]]
    placed = [parse_placed(text) for text in plan.device_actions]
    assert placed == zb_v(P, M, recompute=True)
    assert [st.action_list() for st in plan.stages] == stage_lists(placed, 2 * P)
    assert [st.ranks for st in plan.stages] == [[0], [1], [1], [0]]
    assert sorted(b for st in plan.stages for b in st.blocks) == list(range(6))
    assert [[s.index for s in plan.hosted(r)] for r in (0, 1)] == [[0, 3], [1, 2]]
    assert Plan.model_validate_json(plan.model_dump_json()) == plan
    assert isinstance(sim, DeviceSimResult)
    assert plan.prediction.step_time_s == pytest.approx(sim.step_time)
    assert len(plan.prediction.memory_per_stage_gb) == P  # per device: both its stages
    assert len(sim.events) == sum(len(acts) for acts in placed)
    svg = draw_gantt(sim, tmp_path / "zbv.svg").read_text()
    assert "device 0" in svg and "device 1" in svg and "stage 0" not in svg


def test_auto_planner_considers_zb_v() -> None:
    spec = tiny_spec(**{"parallelism.schedule": "auto", "parallelism.data_parallel": 1})
    plan, _ = plan_and_simulate(spec, calibration=_cal(spec))
    seen = {plan.schedule} | {alt.schedule for alt in plan.alternatives}
    assert "zb_v" in seen, seen
    v = next(a for a in plan.alternatives if a.schedule == "zb_v")
    assert v.step_time_s is not None and v.step_time_s > plan.prediction.step_time_s
