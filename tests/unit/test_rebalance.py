"""Balancers (DynPipe Alg. 3 / partition), packing (Alg. 4) and replanning."""

from __future__ import annotations

import itertools

import pytest

from jobctl.engine.calibration.cache import calibration_for
from jobctl.engine.planner.partition import bottleneck
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.planner.stage_costs import BlockTimes
from jobctl.engine.rebalance.rebalancer import (
    Move,
    diffusion,
    first_fit_pack,
    imbalance,
    loads_of,
    moves_between,
    rebalance,
)
from jobctl.engine.rebalance.replan import (
    choose_pack,
    layout_of,
    memory_model,
    replan,
    simulate_stages,
)
from jobctl.engine.schedule.generators import validate

from ..jobrun import tiny_spec

# Pruning from step 10 to 50 on 3 stages with rebalancing (plan-prediction tests).
PRUNED_3_STAGES = {
    "pruning.enabled": True,
    "pruning.start_step": 10,
    "pruning.end_step": 50,
    "pruning.sparse_threshold": 0.5,
    "rebalancing.enabled": True,
    "parallelism.pipeline_stages": 3,
    "parallelism.data_parallel": 1,
}


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


def test_packing_is_first_fit_then_the_balancer():
    from jobctl.engine.planner.search import GB
    from jobctl.engine.rebalance.replan import pack_to

    spec = tiny_spec(**{"parallelism.pipeline_stages": 3, "parallelism.data_parallel": 1})
    plan, cal = make_plan(spec), calibration_for(spec)
    current = [list(s.blocks) for s in plan.stages]
    costs = [1.0, 4.0, 4.0, 1.0, 1.0, 1.0]
    # Ample memory: Alg. 4 merges stage 0 into its neighbour; the balancer then evens
    # the two stages out (partition: the optimal cut; diffusion: from the merged map).
    merged = [current[0] + current[1], current[2]]
    assert first_fit_pack([1.0, 1.0, 1.0], cap=10.0, target=2) == [[0, 1], [2]]
    got = pack_to(spec, cal, plan, current, 2, costs, "partition")
    assert max(loads_of(costs, got)) == pytest.approx(bottleneck(costs, 2))
    mem2 = memory_model(spec, cal, layout_of(plan, 2))
    got = pack_to(spec, cal, plan, current, 2, costs, "diffusion")
    assert got == diffusion(costs, merged, mem2, cap=spec.hardware.memory_gb * GB)[0]
    assert pack_to(spec, cal, plan, current, 1, costs, "diffusion") == [list(range(6))]
    # Two neighbouring stages never fit one device: first fit cannot reach 2 devices.
    mem = memory_model(spec, cal, layout_of(plan))(current)
    cap = (max(mem) + min(a + b for a, b in itertools.pairwise(mem))) / 2
    hw = spec.hardware.model_copy(update={"memory_gb": cap / GB})
    small = spec.model_copy(update={"hardware": hw})
    assert pack_to(small, cal, plan, current, 2, costs, "partition") is None
    assert choose_pack(small, cal, plan, costs, current, 10.0, target_devices=2) is None
    pick = choose_pack(spec, cal, plan, costs, current, 10.0, target_devices=2)
    assert pick is not None and pick.P == 2 and pick.considered[-1][2] == "chosen"


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


def _block_layers(spec, block: int):
    from jobctl.engine.rebalance.preview import model_layers

    totals, layers = model_layers(spec)
    return totals, {x.name.split(".", 2)[2]: x for x in layers if x.block == block}


def test_pruned_cost_prediction_per_layer_by_hand():
    from jobctl.engine.rebalance.preview import pruned_costs

    spec = tiny_spec(**{"pruning.enabled": True, "pruning.end_step": 50})  # hidden 64
    totals, layers = _block_layers(spec, 1)
    qkv, rest = layers["attn.qkv.weight"], ["attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight"]
    assert (qkv.shape, qkv.numel, totals[1]) == ((192, 64), 12288, 49984)
    assert totals[0] == 18432 and totals[-1] == 16512  # embedding, head: not prunable
    times = [1.0] * len(totals)
    sparsity = {x.name: 0.3 for b in range(1, 5) for x in _block_layers(spec, b)[1].values()}
    sparsity["layers.1.attn.qkv.weight"] = 0.95
    # Dense kernels: masked weights cost the same; nonzeros drop per layer.
    dense = spec.model_copy(
        update={"pruning": spec.pruning.model_copy(update={"sparse_threshold": None})}
    )
    secs, nnz = pruned_costs(dense, times, sparsity, {}, 64)
    assert secs == times
    others = sum(layers[n].numel for n in rest)
    assert nnz[1] == pytest.approx(49984 - 12288 * 0.95 - others * 0.3) and nnz[0] == 18432
    # A fixed threshold: a CSR layer's time is proportional to its nonzeros, equal at 0.5.
    fixed = spec.model_copy(
        update={"pruning": spec.pruning.model_copy(update={"sparse_threshold": 0.5})}
    )
    secs, _ = pruned_costs(fixed, times, sparsity, {}, 64)
    assert secs[1] == pytest.approx(1 - 12288 / 49984 * (1 - 0.05 / 0.5)) and secs[2] == 1.0
    # auto: the measured ratio of the shape at the nearest sparsity measured below.
    records = {
        "192x64@64": {"crossover": 0.9, "ratios": {"0.9": 0.6, "0.99": 0.3}},
        "256x64@64": {"crossover": None, "ratios": {"0.99": 1.4}},
    }
    secs, _ = pruned_costs(spec, times, sparsity, records, 64)
    assert secs[1] == pytest.approx(1 - 12288 / 49984 * (1 - 0.6)) and secs[2] == 1.0
    secs, _ = pruned_costs(spec, times, sparsity, records, 128)  # another shape class
    assert secs[1] == 1.0


def test_idle_fraction_of_a_simulated_step_by_hand():
    from jobctl.engine.planner.simulator.simulation import CostModel, simulate
    from jobctl.engine.rebalance.preview import idle_fractions
    from jobctl.engine.schedule.generators import generate

    # Uniform stages, no communication: every stage idles (P - 1) / (M + P - 1).
    P, M = 3, 4
    sim = simulate(generate("1f1b", P, M), CostModel.uniform(P, f=1.0, b=2.0))
    assert idle_fractions(sim) == pytest.approx([(P - 1) / (M + P - 1)] * P)
    # GPipe, 2 stages, stage 1 twice as slow (f 1/2, b 2/4), 4 micro-batches: stage 1
    # forwards 1-9, backwards 9-25; stage 0's last backward ends at 27. Busy 12 and 24.
    sim = simulate(generate("gpipe", 2, 4), CostModel(f=(1.0, 2.0), b=(2.0, 4.0)))
    assert sim.step_time == pytest.approx(27.0)
    assert idle_fractions(sim) == pytest.approx([1 - 12 / 27, 1 - 24 / 27])


def test_prediction_uses_the_recorded_per_layer_sparsity(tmp_path):
    import json

    from jobctl.engine.rebalance.preview import model_layers, predict, pruned_costs
    from jobctl.engine.state.db import StateDB

    spec = tiny_spec(**PRUNED_3_STAGES)
    plan = make_plan(spec)
    rows = predict(spec, plan, tmp_path)
    assert {r.source for r in rows} == {"uniform"}  # no earlier run: the schedule
    # An earlier run of this job recorded step 20: global pruning hit block 1 hardest.
    _, layers = model_layers(spec)
    recorded = {x.name: 0.99 if x.block == 1 else 0.4 for x in layers}
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    rec = {"kind": "pruning", "step": 20, "target_sparsity": rows[0].sparsity}
    (run_dir / "metrics.jsonl").write_text(json.dumps({**rec, "layer_sparsity": recorded}) + "\n")
    StateDB(tmp_path).create_run("r1", spec.name, run_dir)
    rows = predict(spec, plan, tmp_path)
    assert [r.source for r in rows] == ["profile", "uniform", "uniform", "uniform"]
    cal = calibration_for(spec, tmp_path)
    times = BlockTimes.at(cal, plan.micro_batch_size)
    base = [f + b for f, b in zip(times.fwd, times.bwd, strict=True)]
    tokens = plan.micro_batch_size * spec.model.seq_len
    secs, _ = pruned_costs(spec, base, recorded, {}, tokens)
    stages = [s.blocks for s in plan.stages]
    assert rows[0].static == pytest.approx(loads_of(secs, stages))
    assert secs[1] < 0.5 * base[1] and secs[2] == base[2]  # only block 1 runs CSR
    assert len(rows[0].idle_static) == 3 and max(rows[0].idle_balanced) <= max(rows[0].idle_static)


def test_plan_shows_predicted_imbalance_and_rebalancing(tmp_path):
    from typer.testing import CliRunner

    from jobctl.engine.cli.app import app
    from jobctl.spec import dump_yaml

    spec = tiny_spec(**PRUNED_3_STAGES)
    path = tmp_path / "job.yaml"
    path.write_text(dump_yaml(spec))
    r = CliRunner().invoke(app, ["plan", str(path), "--home", str(tmp_path)], terminal_width=160)
    assert r.exit_code == 0, r.output
    assert "predicted stage idle after pruning (rebalancing: partition by time)" in r.output
    rows = [x for x in r.output.splitlines() if x.startswith("│") and "%)" in x]
    assert [row.split("│")[1].strip() for row in rows] == [
        "20 (52 %)",
        "30 (79 %)",
        "40 (89 %)",
        "50 (90 %)",
    ]
    assert all(row.split("│")[2].strip() == "uniform" for row in rows)
    assert "idle % = 1 - busy / step time of the simulated step" in r.output


@pytest.mark.parametrize(
    ("layout", "why"),
    [
        ({"parallelism.schedule": "zb_v", "parallelism.pipeline_stages": 2}, None),
        ({"parallelism.tensor_parallel": 2, "parallelism.pipeline_stages": 2}, "T"),
        (
            {
                "parallelism.schedule": "mobius",
                "parallelism.pipeline_stages": 4,
                "hardware.processes_per_node": 2,
            },
            "schedule mobius",
        ),
    ],
)
def test_plan_of_a_pruned_zb_v_T2_or_mobius_job_shows_what_rebalancing_does(tmp_path, layout, why):
    # Pruning and rebalancing run under zb_v, T > 1 and Mobius; the preview predicts
    # resident, unsplit stages: zb_v only.
    from typer.testing import CliRunner

    from jobctl.engine.cli.app import app
    from jobctl.spec import dump_yaml

    on = {k: v for k, v in PRUNED_3_STAGES.items() if not k.startswith("rebalancing")}
    spec = tiny_spec(**{**on, "hardware.nodes": 1, "hardware.processes_per_node": 4, **layout})
    path = tmp_path / "job.yaml"
    path.write_text(dump_yaml(spec))
    r = CliRunner().invoke(app, ["plan", str(path), "--home", str(tmp_path)], terminal_width=80)
    assert r.exit_code == 0, r.output
    assert "pruning schedule" in r.output
    # zb_v (why None) rebalances its 2P stages, per device: the preview is there
    assert ("predicted stage idle" in r.output) == (why is None)
    if why == "T":
        assert "rebalancing preview: none at tensor_parallel 2 (the preview" in r.output
    elif why is not None:
        assert f"rebalancing preview: none under {why} (the preview" in r.output
    if why is not None:
        assert "the run rebalances by its measured per-block times" in r.output
    assert "profiles every block" in r.output
    section = r.output[r.output.index("pruning schedule") :]
    assert max(len(line) for line in section.splitlines()) <= 80


def test_spec_target_devices_needs_pack():
    from jobctl.spec.errors import SpecError

    with pytest.raises(SpecError, match="set rebalancing.pack: true"):
        tiny_spec(**{"rebalancing.target_devices": 2})
    spec = tiny_spec(**{"rebalancing.pack": True, "rebalancing.target_devices": 2})
    assert spec.rebalancing.hold_steps == 0


def test_block_figures_of_pipeline_and_mobius_offers():
    from jobctl.engine.rebalance.hook import replica0_blocks

    # a pipeline's T group: the slowest shard's seconds, the shards' counts summed;
    # replica 1's copies of the blocks do not count twice
    tp = [
        {"replica": 0, "time": {0: 1.0, 1: 2.0}, "nnz": {0: 5.5, 1: 7.0}},
        {"replica": 0, "time": {0: 1.5, 1: 1.0}, "nnz": {0: 5.5, 1: 7.0}},
        {"replica": 1, "time": {0: 9.0, 1: 9.0}, "nnz": {0: 99, 1: 99}},
    ]
    assert replica0_blocks(tp, 2) == ([1.5, 2.0], [11, 14])
    # Mobius ranks (rebalance.swapped): no replica, the profile's string keys, each
    # block on one rank
    mobius = [
        {"time": {"0": 0.5, "2": 0.25}, "nnz": {"0": 10, "2": 30}},
        {"time": {"1": 0.75, "3": 1.0}, "nnz": {"1": 20, "3": 40}},
    ]
    assert replica0_blocks(mobius, 4) == ([0.5, 0.75, 0.25, 1.0], [10, 20, 30, 40])
