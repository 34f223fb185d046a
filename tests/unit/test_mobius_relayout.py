"""A Mobius runner re-cut while it trains (engine/mobius/relayout.py): training goes on
exactly as one process trains, optimizer slots and pruning masks moving with their
blocks, and the plan's re-cut (mobius.planning.plan.recut) says where each block is."""

from __future__ import annotations

import pytest
import torch

from jobctl.engine.calibration import cache
from jobctl.engine.calibration.analytic import analytic_calibration
from jobctl.engine.mobius.masks import held, hold
from jobctl.engine.mobius.planning.plan import cut_step_s, mobius_plan, recut, stage_memory
from jobctl.engine.mobius.relayout import owners, relaid
from jobctl.engine.worker.reference import reference_train

from ..jobrun import tiny_spec
from .mobius_helpers import ADAMW, one_thread, runner_and_def  # noqa: F401 - one_thread: autouse


def test_a_re_cut_runner_trains_on_like_one_process(tmp_path):
    spec = tiny_spec(**{"model.layers": 4, "training.steps": 4, **ADAMW})
    ref_losses, ref_weights = reference_train(spec, micro_batch=2)
    runner, mdef = runner_and_def(spec, tmp_path, ((0, 1), (2,), (3,), (4, 5)))
    losses = [runner.step(t) for t in range(2)]  # step 1's update still pending
    runner = relaid(runner, mdef, [[0], [1, 2], [3, 4], [5]])
    assert runner.cfg.stages == ((0,), (1, 2), (3, 4), (5,))
    losses += [runner.step(t) for t in range(2, 4)]
    runner.flush()
    weights = runner.weights()
    runner.close()
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    for name, w in ref_weights.items():
        # Adam's key-bias rounding noise, as in tests/unit/test_mobius_runtime.py
        atol = 5e-4 if name.endswith("qkv.bias") else 1e-5
        torch.testing.assert_close(weights[name], w, atol=atol, rtol=0, msg=name)


def test_masks_and_slots_move_with_their_blocks(tmp_path):
    spec = tiny_spec(**{"model.layers": 4, "training.steps": 2, **ADAMW})
    runner, mdef = runner_and_def(spec, tmp_path, ((0, 1), (2,), (3,), (4, 5)))
    runner.step(0)
    w = runner.weights()["layers.2.mlp.fc.weight"]
    mask = torch.rand(w.shape, generator=torch.Generator().manual_seed(0)) > 0.5
    hold(runner, {"layers.2.mlp.fc.weight": mask})
    runner.step(1)
    runner.flush()
    before = runner.weights()
    runner = relaid(runner, mdef, [[0, 1, 2], [3], [4], [5]])
    after = runner.weights()
    assert torch.equal(held(runner)["layers.2.mlp.fc.weight"], mask)
    assert not after["layers.2.mlp.fc.weight"][~mask].any()
    for name, t in before.items():
        assert torch.equal(after[name], t), name
    runner.step(2)  # an update on upload keeps the moved mask
    runner.flush()
    assert not runner.weights()["layers.2.mlp.fc.weight"][~mask].any()
    runner.close()


def test_a_re_cut_keeps_s_and_each_stage_rank():
    assert owners([[0, 1], [2], [3, 4]], (0, 1, 0)) == {0: 0, 1: 0, 2: 1, 3: 0, 4: 0}
    spec = tiny_spec(
        **{
            "model.layers": 4,
            "parallelism.schedule": "mobius",
            "parallelism.pipeline_stages": 4,
            "parallelism.data_parallel": 1,
            "hardware.nodes": 1,
            "hardware.processes_per_node": 2,
        }
    )
    cal = analytic_calibration(spec, cache.fingerprint(spec))
    plan = mobius_plan(spec, cal, 2)
    new = recut(spec, cal, plan, [[0], [1, 2], [3, 4], [5]])
    assert new.mobius.stages == [[0], [1, 2], [3, 4], [5]]
    assert new.mobius.ranks == plan.mobius.ranks and new.mobius.S == 4
    assert [s.blocks for s in new.stages] == [[0, 3, 4], [1, 2, 5]]
    assert new.mobius.step_time_s > 0
    # the rebalancer prices a cut without re-cutting the plan: the same seconds
    assert cut_step_s(spec, cal, plan, new.mobius.stages) == new.mobius.step_time_s
    memory, cap = stage_memory(spec, cal, plan)
    assert all(0 < b <= cap for b in memory(new.mobius.stages))
