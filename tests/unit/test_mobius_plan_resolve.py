"""A ``schedule: mobius`` job planned (engine/mobius/planning/plan.py): the MIP at the
spec's S, the cross mapping from ``hardware.topology``, the Plan around it."""

from __future__ import annotations

import math
import random

import pytest

from jobctl.engine.mobius.planning.costs import step_time
from jobctl.engine.mobius.planning.cross_mapping import Topology, cross_mapping
from jobctl.engine.mobius.planning.partition import mobius_partition
from jobctl.engine.planner.resolver import make_plan, plan_priced
from jobctl.engine.planner.search import PlanError

from ..jobrun import tiny_spec
from .test_mobius_partition import compositions, instance


def _spec(S: int, devices: int = 2, **extra):
    return tiny_spec(
        **{
            "model.layers": 6,
            "hardware.nodes": 1,
            "hardware.processes_per_node": devices,
            "parallelism.data_parallel": 1,
            "parallelism.pipeline_stages": S,
            "parallelism.schedule": "mobius",
            **extra,
        }
    )


def test_mip_at_a_given_stage_count_equals_brute_force() -> None:
    rng, swapped = random.Random(4), 0
    for _ in range(12):
        layers, cfg = instance(rng)
        S = rng.randint(1, len(layers))
        fits = [s for s in compositions(len(layers)) if len(s) == S]
        best = min(step_time(layers, s, cfg) for s in fits)
        if not math.isfinite(best):
            with pytest.raises(ValueError, match="memory"):
                mobius_partition(layers, cfg, stages=S)
            continue
        part = mobius_partition(layers, cfg, stages=S)
        assert len(part.stages) == S and part.optimal
        assert part.step_time_s == pytest.approx(best, rel=1e-6)
        swapped += cfg.devices < S
    assert swapped >= 5  # half the instances fit, all of those with S > N


def test_plan_holds_the_stages_and_every_rank_s_blocks() -> None:
    plan = make_plan(_spec(5))
    lay = plan.mobius
    assert (plan.schedule, plan.P, plan.D, plan.T, plan.world_size) == ("mobius", 2, 1, 1, 2)
    assert lay.S == 5 and lay.ranks == [0, 1, 0, 1, 0]  # no topology: j % N
    assert [b for s in lay.stages for b in s] == list(range(8))  # 6 layers + 2 blocks
    for r in range(2):
        assert plan.stages[r].blocks == [b for j in lay.hosted(r) for b in lay.stages[j]]
        assert plan.ranks[r].stage == r and plan.stages[r].ranks == [r]
    assert plan.micro_batch_size == 2 and plan.micro_batches == 8
    assert plan.prediction.step_time_s == lay.step_time_s > 0
    assert "S = 5 stages on N = 2 ranks" in plan.explanation[0]


def test_topology_gives_the_cross_mapping() -> None:
    # Mobius Figure 4: 8 stages, 4 devices, two root complexes.
    rcs = [[0, 1], [2, 3]]
    plan = make_plan(_spec(8, 4, **{"hardware.topology": {"root_complexes": rcs}}))
    want = cross_mapping(8, Topology(root_complexes=rcs))
    assert tuple(plan.mobius.ranks) == want.stage_devices != tuple(j % 4 for j in range(8))
    assert plan.mobius.contention == float(want.contention) < plan.mobius.sequential
    assert "cross mapping (sec. 3.3)" in plan.explanation[1]


def test_topology_over_several_nodes_is_not_applied_and_says_so() -> None:
    topo = {"hardware.topology": {"root_complexes": [[0], [1]]}, "hardware.nodes": 2}
    plan = make_plan(_spec(5, **topo))
    assert plan.mobius.ranks == [0, 1, 2, 3, 0] and plan.nodes == 2
    assert "hardware.topology not applied" in plan.explanation[1]


def test_a_budget_no_cut_fits_is_a_plan_error() -> None:
    with pytest.raises(PlanError, match="hardware.memory_gb"):
        make_plan(_spec(3, **{"hardware.memory_gb": 1e-6}))


def test_plan_priced_refuses_mobius_with_a_reason() -> None:
    with pytest.raises(PlanError, match="jobctl apply"):
        plan_priced(_spec(4))


def test_reserved_buffers_over_the_budget_are_a_plan_error() -> None:
    # One block per stage (one partition); hidden 256: a block's AdamW record (16 B a
    # parameter) twice is over the budget below, its MIP memory (weights, gradients,
    # the stashed activations) is not.
    wide = {"model.hidden": 256, "training.micro_batch_size": 2}
    need = max(make_plan(_spec(8, **wide)).prediction.memory_per_stage_gb)
    with pytest.raises(PlanError, match="two reserved buffers .* need"):
        make_plan(_spec(8, **wide, **{"hardware.memory_gb": 0.9 * need}))
    assert make_plan(_spec(8, **wide, **{"hardware.memory_gb": 1.01 * need})).mobius.S == 8


def test_auto_micro_batch_gives_every_rank_a_micro_batch() -> None:
    plan = make_plan(_spec(5, **{"training.micro_batch_size": "auto"}))
    assert (plan.micro_batch_size, plan.micro_batches) == (8, 2)  # B = 16, N = 2
