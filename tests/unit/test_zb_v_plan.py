"""ZB-V as a job's schedule: the spec's refusals, the planner's V plan (placement,
device lists, simulated step, Gantt by device) and the auto search's V variant."""

from __future__ import annotations

from itertools import combinations

import pytest
from rich.console import Console

from jobctl.engine.calibration.analytic import analytic_calibration
from jobctl.engine.calibration.cache import analytic_fingerprint
from jobctl.engine.core.plan import Plan
from jobctl.engine.planner.resolver import plan_and_simulate
from jobctl.engine.planner.simulator.devices import DeviceSimResult
from jobctl.engine.planner.v_shape import v_partition
from jobctl.engine.schedule.placement import parse_placed, stage_lists
from jobctl.engine.schedule.zero_bubble import zb_v
from jobctl.engine.views.gantt import draw_gantt
from jobctl.engine.views.tables import print_plan
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
        (
            "rebalancing:\n  enabled: true\n  pack: true\n",
            "rebalancing.pack",
            12,
            "another placement of every stage",
            "set rebalancing.pack: false",
        ),
    ],
)
def test_zb_v_refusals_name_the_field_line_and_fix(extra, path, line, message, fix) -> None:
    with pytest.raises(SpecError) as info:
        load_spec_text(SPEC.format(P=2, extra=extra), "jobs/zbv.yaml")
    (issue,) = info.value.errors
    assert (issue.path, issue.file, issue.line) == (path, "jobs/zbv.yaml", line)
    assert message in issue.message and fix in issue.fix


def test_zb_v_runs_pruning() -> None:
    # a V rank masks its two stages as one (tests/integration/test_parity_zero_bubble.py)
    prune = "pruning:\n  enabled: true\n  start_step: 1\n  end_step: 4\n  frequency: 1\n"
    spec = load_spec_text(SPEC.format(P=2, extra=prune), "jobs/zbv.yaml")
    assert spec.pruning.enabled and spec.parallelism.schedule == "zb_v"


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
    spec = tiny_spec(
        **{
            "parallelism.schedule": "zb_v",
            "parallelism.data_parallel": 1,
            "parallelism.recompute": "all",
        }
    )
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
    console = Console(record=True, width=80)
    print_plan(console, plan)
    text = console.export_text()
    assert f"D0: {plan.device_actions[0][:40]}" in text and "memory per device" in text


def test_auto_planner_never_picks_zb_v_on_shared_cores() -> None:
    spec = tiny_spec(**{"parallelism.schedule": "auto", "parallelism.data_parallel": 1})
    plan, _ = plan_and_simulate(spec, calibration=_cal(spec))
    assert plan.schedule != "zb_v" and plan.placement is None
    assert not any("zb_v" in line for line in plan.explanation)


def test_zb_v_is_refused_on_cuda_and_auto_never_picks_it_there() -> None:
    """NCCL ignores the tags that tell the V's two legs apart between two ranks."""
    gpu = "hardware:\n  device: cuda\n  accelerator: h100-sxm-80gb\n"
    with pytest.raises(SpecError) as info:
        load_spec_text(SPEC.format(P=2, extra=gpu), "jobs/zbv.yaml")
    (issue,) = info.value.errors
    assert (issue.path, issue.line) == ("hardware.device", 11)
    assert "NCCL" in issue.message and "zb_h1" in issue.fix
    # where the V variant would be faster on GPUs (8 blocks, P = 2, M = 8: it halves
    # ZB-H1's bubble), auto keeps the search's one-stage answer
    spec = tiny_spec(
        **{
            "parallelism.schedule": "auto",
            "parallelism.data_parallel": 1,
            "model.layers": 6,
            "hardware.device": "cuda",
            "hardware.accelerator": "h100-sxm-80gb",
            "hardware.nodes": 1,
            "hardware.processes_per_node": 2,
        }
    )
    plan, _ = plan_and_simulate(spec, calibration=_cal(spec))
    assert plan.schedule != "zb_v" and plan.placement is None


def test_auto_planner_picks_zb_v_where_faster() -> None:
    # 8 blocks of 256 on P = 2 CPU ranks of a Slurm cluster (no cores shared), M = 8:
    # the V variant's smaller bubble outweighs its sends (at hidden 64 it does not)
    spec = tiny_spec(
        **{
            "parallelism.schedule": "auto",
            "parallelism.data_parallel": 1,
            "model.layers": 6,
            "model.hidden": 256,
            "hardware.nodes": 2,
            "hardware.processes_per_node": 1,
            "hardware.backend": "slurm",
        }
    )
    plan, sim = plan_and_simulate(spec, calibration=_cal(spec))
    alts = {a.schedule: a for a in plan.alternatives if a.step_time_s is not None}
    assert plan.schedule == "zb_v", (plan.schedule, alts)
    assert isinstance(sim, DeviceSimResult) and len(sim.executed) == 2 * plan.P
    assert alts["zb_h1"].step_time_s > plan.prediction.step_time_s


def test_v_partition_balances_devices_not_stages() -> None:
    # GPT-like: a light embedding, six equal blocks, a light head. Stage-balanced
    # [[0, 1], [2, 3], [4, 5], [6, 7]] loads device 1 (stages 1, 2) with 244 and
    # device 0 (stages 0, 3) with 143; the best V split, by every cut, has 204.
    costs = [1.0, 61.0, 61.0, 61.0, 61.0, 61.0, 61.0, 20.0]

    def heaviest(stages: list[list[int]]) -> float:
        return max(sum(costs[b] for b in stages[d] + stages[3 - d]) for d in range(2))

    start = [[0, 1], [2, 3], [4, 5], [6, 7]]
    stages = v_partition(costs, 2, start)
    assert [b for st in stages for b in st] == list(range(8)) and all(stages)
    every = [
        [list(range(e[k], e[k + 1])) for k in range(4)]
        for e in ([0, *c, 8] for c in combinations(range(1, 8), 3))
    ]
    assert heaviest(start) == 244.0
    assert heaviest(stages) == min(map(heaviest, every)) == 204.0
    assert v_partition(costs, 1, [[0, 1, 2, 3], [4, 5, 6, 7]]) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_zb_v_runs_averaging_at_a_fixed_m_n_only() -> None:
    # AvgPipe's models interleave on a V rank's two stages
    # (tests/integration/test_elastic_averaging.py); its (M, N) tuner profiles one stage
    # per rank, so auto is refused with the field and a fix.
    fields = {
        "parallelism.schedule": "zb_v",
        "parallelism.data_parallel": 1,
        "parallelism.averaging": "elastic",
        "hardware.nodes": 1,
    }
    ok = tiny_spec(**fields, **{"parallelism.parallel_pipelines": 2})
    assert ok.parallelism.averaging == "elastic"
    with pytest.raises(SpecError) as info:
        tiny_spec(**fields, **{"parallelism.parallel_pipelines": "auto"})
    (issue,) = [i for i in info.value.errors if "tuner" in i.message]
    assert issue.path == "parallelism.parallel_pipelines" and "to numbers" in issue.fix
