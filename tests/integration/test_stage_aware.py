"""Stage-aware recomputation end to end: planned under a memory cap, run with real
processes, and equal to one process (Merak sec. 5.2)."""

from __future__ import annotations

import pytest
import torch

from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.worker.reference import reference_train

from ..jobrun import final_weights, run_job, step_losses, tiny_spec

SGD = {"training.optimizer": "sgd", "training.lr": 0.3, "training.momentum": 0.9}


@pytest.mark.multiproc
def test_stage_aware_plan_runs_like_one_process(tmp_path):
    shape = {
        **SGD,
        "model.layers": 7,
        "parallelism.pipeline_stages": 3,
        "parallelism.data_parallel": 1,
        "hardware.nodes": 1,
        "hardware.processes_per_node": 3,
        "training.steps": 3,
        "checkpoint.interval": 3,
    }
    # A cap under what stage 0 needs keeping every activation, whatever the calibration.
    full = make_plan(tiny_spec(**shape)).prediction.memory_per_stage_gb
    cap = 0.9 * full[0]
    spec = tiny_spec(**shape, **{"parallelism.recompute": "stage_aware", "hardware.memory_gb": cap})
    run = _runs_like_one_process(tmp_path, spec, cap)
    keep, stages = [s.keep_blocks for s in run.plan.stages], run.plan.stages
    assert keep[0] < len(stages[0].blocks) and keep[-1] == len(stages[-1].blocks), keep


def _runs_like_one_process(tmp_path, spec, cap: float):
    """Run ``spec``: its plan within ``cap``, recompute inside the backward (no R
    actions), losses and final weights one process's to 1e-5; the run."""
    ref_losses, ref_weights = reference_train(spec)
    run, outcome = run_job(spec, tmp_path)
    assert outcome.ok, outcome.message
    assert max(run.plan.prediction.memory_per_stage_gb) <= cap
    assert not any(s.recompute for s in run.plan.stages)
    assert step_losses(run.dir) == pytest.approx(ref_losses, abs=1e-5)
    weights = final_weights(run.dir, 3)
    for name, w in ref_weights.items():
        torch.testing.assert_close(weights[name], w, atol=1e-5, rtol=0, msg=name)
    return run


@pytest.mark.multiproc
@pytest.mark.parametrize(("schedule", "P"), [("zb_h1", 3), ("zb_v", 2)])
def test_stage_aware_under_zero_bubble_runs_like_one_process(tmp_path, schedule, P):
    # ZB-H1 takes Merak's ratios as 1F1B does; ZB-V's ratios are tuned per device (its
    # two stages' own in-flight counts). A cap between full and no recomputation:
    # some blocks keep their activations, the rest recompute in the B/W-split backward.
    shape = {
        **SGD,
        "model.layers": 8,
        "parallelism.pipeline_stages": P,
        "parallelism.data_parallel": 1,
        "parallelism.schedule": schedule,
        "hardware.nodes": 1,
        "hardware.processes_per_node": P,
        "training.steps": 3,
        "checkpoint.interval": 3,
    }
    peaks = {
        how: max(
            make_plan(
                tiny_spec(**shape, **{"parallelism.recompute": how})
            ).prediction.memory_per_stage_gb
        )
        for how in ("all", "none")
    }
    cap = (peaks["all"] + peaks["none"]) / 2
    spec = tiny_spec(**shape, **{"parallelism.recompute": "stage_aware", "hardware.memory_gb": cap})
    run = _runs_like_one_process(tmp_path, spec, cap)
    stages = run.plan.stages
    keep = [s.keep_blocks for s in stages]
    assert all(k is not None for k in keep), keep
    assert any(k < len(s.blocks) for k, s in zip(keep, stages, strict=True)), keep
    assert any(k > 0 for k in keep), keep  # neither full nor no recomputation
    assert any("stage-aware recomputation" in line for line in run.plan.explanation)
