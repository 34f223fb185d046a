"""Balancers (DynPipe Alg. 3 / partition), packing (Alg. 4) and replanning."""

from __future__ import annotations

import itertools

import pytest

from jobctl.engine.calibration_cache import calibration_for
from jobctl.engine.partition import bottleneck
from jobctl.engine.planner import make_plan
from jobctl.engine.rebalance import (
    Move,
    diffusion,
    first_fit_pack,
    imbalance,
    loads_of,
    moves_between,
    rebalance,
)
from jobctl.engine.rebalance_plan import (
    choose_pack,
    layout_of,
    memory_model,
    replan,
    simulate_stages,
)
from jobctl.engine.schedules import validate

from .jobrun import tiny_spec


def test_imbalance_and_loads():
    assert imbalance([1.0, 1.0]) == 0.0
    assert imbalance([3.0, 1.0]) == pytest.approx(0.5)
    assert loads_of([1, 2, 3, 4], [[0, 1], [2, 3]]) == [3, 7]


def test_moves_between_lists_changed_blocks():
    assert moves_between([[0, 1], [2, 3]], [[0], [1, 2, 3]]) == [Move(1, 0, 1)]
    with pytest.raises(ValueError, match="different blocks"):
        moves_between([[0, 1]], [[0]])


def test_diffusion_moves_boundary_blocks_to_the_lighter_neighbour():
    # Stage 0 is overloaded (pruned middle blocks are cheap, the embedding is not).
    costs = [4.0, 4.0, 1.0, 1.0, 1.0, 1.0]
    stages, iters = diffusion(costs, [[0, 1, 2], [3, 4, 5]])
    assert stages == [[0, 1], [2, 3, 4, 5]]
    assert loads_of(costs, stages) == [8.0, 4.0]  # one move: variance 9 -> 4
    assert iters == 2  # the second iteration accepts nothing and stops


def test_diffusion_respects_memory():
    costs = [4.0, 4.0, 1.0, 1.0, 1.0, 1.0]
    mem = [1.0] * 6

    def memory(stages):
        return [sum(mem[i] for i in s) for s in stages]

    stages, _ = diffusion(costs, [[0, 1, 2], [3, 4, 5]], memory, cap=3.0)
    assert stages == [[0, 1, 2], [3, 4, 5]]  # stage 1 cannot take a fourth block


def test_diffusion_reaches_every_stage_of_a_deep_pipeline():
    costs = [10.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 10.0]
    start = [[0, 1, 2], [3, 4], [5, 6], [7, 8, 9]]
    stages, _ = diffusion(costs, start)
    assert [b for s in stages for b in s] == list(range(10))
    assert max(loads_of(costs, stages)) < max(loads_of(costs, start))


@pytest.mark.parametrize("seed", range(20))
def test_partition_balancer_is_optimal_and_never_worse(seed):
    import random

    rng = random.Random(seed)
    costs = [rng.uniform(0.1, 5.0) for _ in range(rng.randint(3, 9))]
    P = rng.randint(2, min(4, len(costs)))
    n = len(costs)
    cuts = sorted(rng.sample(range(1, n), P - 1))
    start = [list(range(a, b)) for a, b in itertools.pairwise([0, *cuts, n])]
    for balancer in ("partition", "diffusion"):
        d = rebalance(costs, start, balancer, tolerance=0.0)
        assert max(d.after) <= max(d.before) + 1e-12
        assert [b for s in d.stages for b in s] == list(range(n))
        assert all(d.stages)
        if balancer == "partition" and d.changed:
            assert max(d.after) == pytest.approx(bottleneck(costs, P))


def test_tolerance_keeps_a_nearly_balanced_pipeline():
    d = rebalance([1.0, 1.02, 1.0, 1.0], [[0, 1], [2, 3]], "partition", tolerance=0.05)
    assert not d.changed and "tolerance" in d.reason
    d = rebalance([1.0, 1.0, 1.0, 1.0], [[0, 1, 2], [3]], "partition", tolerance=0.05)
    assert d.changed and d.stages == [[0, 1], [2, 3]] and d.moves == [Move(2, 0, 1)]


def test_unknown_balancer_and_bad_map():
    with pytest.raises(ValueError, match="valid: diffusion, partition"):
        rebalance([1.0, 5.0], [[0], [1]], "greedy", tolerance=0.0)
    with pytest.raises(ValueError, match="contiguous"):
        rebalance([1.0, 5.0], [[1], [0]], "partition")


def test_first_fit_pack_alg4():
    assert first_fit_pack([1.0, 1.0, 1.0, 1.0], cap=2.5, target=1) == [[0, 1], [2, 3]]
    assert first_fit_pack([1.0, 1.0, 1.0, 1.0], cap=10.0, target=2) == [[0, 1, 2], [3]]
    assert first_fit_pack([3.0, 3.0], cap=4.0, target=1) == [[0], [1]]


def test_replan_same_P_keeps_ranks_and_actions():
    spec = tiny_spec(**{"parallelism.pipeline_stages": 2, "parallelism.data_parallel": 2})
    plan = make_plan(spec)
    new = replan(spec, plan, [[0, 1], [2, 3, 4, 5]])
    assert [s.blocks for s in new.stages] == [[0, 1], [2, 3, 4, 5]]
    assert new.ranks == plan.ranks
    assert [s.actions for s in new.stages] == [s.actions for s in plan.stages]


def test_replan_fewer_stages_regenerates_schedule():
    spec = tiny_spec(**{"parallelism.pipeline_stages": 3, "parallelism.data_parallel": 1})
    plan = make_plan(spec)
    new = replan(spec, plan, [[0, 1, 2], [3, 4, 5]])
    assert (new.P, new.world_size) == (2, 2)
    assert [r.rank for r in new.ranks] == [0, 1]
    validate([s.action_list() for s in new.stages], new.P, new.micro_batches)


def test_simulator_sees_rebalancing_gain_and_packing():
    spec = tiny_spec(**{"parallelism.pipeline_stages": 3, "parallelism.data_parallel": 1})
    plan = make_plan(spec)
    cal = calibration_for(spec)
    lay = layout_of(plan)
    base = [s.blocks for s in plan.stages]
    # Pruning left the first stage's blocks heavy and the rest light.
    costs = [2e-2 * (5 if b in (0, 1) else 1) for b in range(6)]
    d = rebalance(costs, base, "partition", tolerance=0.0, memory=memory_model(spec, cal, lay))
    before = simulate_stages(spec, cal, lay, base, costs).step_time
    after = simulate_stages(spec, cal, lay, d.stages, costs).step_time
    assert d.stages == [[0], [1], [2, 3, 4, 5]]
    assert after < 0.8 * before
    pick = choose_pack(spec, cal, plan, costs, d.stages, tolerance=10.0)
    assert pick is not None and pick.P < plan.P  # a generous tolerance packs
    fixed = choose_pack(spec, cal, plan, costs, d.stages, tolerance=0.0, target_devices=2)
    assert fixed is not None and fixed.P == 2


def test_pruned_cost_prediction_dense_and_sparse():
    from jobctl.engine.rebalance_views import block_shares, pruned_costs

    spec = tiny_spec(**{"pruning.enabled": True, "pruning.end_step": 50})
    total, prunable = block_shares(spec)
    assert prunable[0] == 0 and prunable[-1] == 0  # embedding, head (not prunable)
    assert all(0 < p < t for p, t in zip(prunable[1:-1], total[1:-1], strict=True))
    times = [1.0] * len(total)
    secs, nnz = pruned_costs(spec, times, 0.9)
    assert secs == times  # dense kernels: masked weights cost the same
    assert nnz[1] == pytest.approx(total[1] - 0.9 * prunable[1]) and nnz[0] == total[0]
    sparse = tiny_spec(
        **{"pruning.enabled": True, "pruning.end_step": 50, "pruning.sparse_threshold": 0.5}
    )
    secs, _ = pruned_costs(sparse, times, 0.9)
    share = prunable[1] / total[1]
    assert secs[1] == pytest.approx(1 - share + share * 0.1 / 0.5) and secs[0] == 1.0


def test_plan_shows_predicted_imbalance_and_rebalancing(tmp_path):
    from typer.testing import CliRunner

    from jobctl.engine.cli import app
    from jobctl.spec import dump_yaml

    spec = tiny_spec(
        **{
            "pruning.enabled": True,
            "pruning.start_step": 10,
            "pruning.end_step": 50,
            "pruning.sparse_threshold": 0.5,
            "rebalancing.enabled": True,
            "parallelism.pipeline_stages": 3,
            "parallelism.data_parallel": 1,
        }
    )
    path = tmp_path / "job.yaml"
    path.write_text(dump_yaml(spec))
    r = CliRunner().invoke(app, ["plan", str(path), "--home", str(tmp_path)], terminal_width=160)
    assert r.exit_code == 0, r.output
    assert "predicted stage load after pruning (rebalancing: partition by time)" in r.output
    rows = [x for x in r.output.splitlines() if x.startswith("│") and "%)" in x]
    assert [row.split("│")[1].strip() for row in rows] == [
        "20 (52 %)",
        "30 (79 %)",
        "40 (89 %)",
        "50 (90 %)",
    ]


def test_spec_target_devices_needs_pack():
    from jobctl.spec.errors import SpecError

    with pytest.raises(SpecError, match="set rebalancing.pack: true"):
        tiny_spec(**{"rebalancing.target_devices": 2})
    spec = tiny_spec(**{"rebalancing.pack": True, "rebalancing.target_devices": 2})
    assert spec.rebalancing.hold_steps == 0
