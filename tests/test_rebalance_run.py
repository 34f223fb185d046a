"""End to end: a pruned run rebalances (layers move live) and packs, same numerics.

A 3-stage job (7 blocks) prunes at steps 2, 4, 6; after each profiled step the partition
balancer by nonzero parameters moves blocks between the live ranks, or the packer
consolidates onto 2 devices (rank 2 exits cleanly). Losses and final weights equal the
single-process reference with the same pruning.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from jobctl.engine.plan import Plan
from jobctl.engine.reference import reference_train
from jobctl.engine.state import StateDB
from jobctl.spec import load_spec

from .jobrun import ROOT, events, final_weights, run_job, step_losses

STEPS = 8


def _spec(**extra):
    overrides = {
        "training.steps": STEPS,
        "model.layers": 5,  # 7 blocks on 3 stages: pruning shifts the parameter balance
        "training.optimizer": "sgd",
        "training.lr": 0.3,
        "training.momentum": 0.9,
        "pruning.start_step": 2,
        "pruning.end_step": 6,
        "pruning.frequency": 2,
        "pruning.initial_sparsity": 0.2,
        "hardware.processes_per_node": 3,
        "parallelism.pipeline_stages": 3,
        "parallelism.data_parallel": 1,
        "rebalancing.enabled": True,
        "rebalancing.balancer": "partition",
        "rebalancing.by": "params",
        "rebalancing.tolerance": 0.0,
        **extra,
    }
    return load_spec(ROOT / "jobs" / "pruning.yaml", overrides=overrides)


def _run_and_compare(tmp_path, spec):
    ref_losses, ref_weights = reference_train(spec, masks={})
    run, outcome = run_job(spec, tmp_path)
    assert outcome.ok, outcome.message
    assert step_losses(run.dir) == pytest.approx(ref_losses, abs=1e-5)
    weights = final_weights(run.dir, STEPS)
    assert set(weights) == set(ref_weights)
    for name, w in ref_weights.items():
        torch.testing.assert_close(weights[name], w, atol=1e-5, rtol=0, msg=name)
    return run, events(run.dir)


@pytest.mark.multiproc
def test_pruned_run_rebalances_with_identical_numerics(tmp_path):
    run, recs = _run_and_compare(tmp_path, _spec())
    moved = [r for r in recs if r["kind"] == "rebalanced"]
    assert [r["step"] for r in moved] == [3, 5, 7]  # after every profiled step
    for r in moved:
        assert r["moves"] and r["stages_after"] != r["stages_before"]
        assert max(r["load_after"]) < max(r["load_before"])
    for before, after in itertools.pairwise(moved):  # each starts where the last ended
        assert after["stages_before"] == before["stages_after"]
    measured = [r for r in recs if r["kind"] == "rebalance_measured"]
    assert [r["step"] for r in measured] == [4, 6, 8]
    assert all(len(m["measured_stage_s_after"]) == 3 for m in measured)
    plan = Plan.model_validate_json((run.dir / "plan.json").read_text())
    assert [s.blocks for s in plan.stages] == moved[-1]["stages_after"]
    kinds = [e["kind"] for e in StateDB(tmp_path).events(run.id)]
    assert kinds.count("rebalanced") == 3


@pytest.mark.multiproc
def test_pruned_run_packs_onto_fewer_devices(tmp_path):
    # Decided after the first profiled step (3), held one step, packed after step 4:
    # rank 2 exits cleanly, the two left keep pruning (their collectives on the live
    # ranks) and training, same numerics.
    pack = {"rebalancing.pack": True, "rebalancing.target_devices": 2}
    spec = _spec(**pack, **{"rebalancing.hold_steps": 1})
    run, recs = _run_and_compare(tmp_path, spec)
    packed = [r for r in recs if r["kind"] == "packed"]
    assert len(packed) == 1 and packed[0]["step"] == 3
    assert packed[0]["packed_to"] == 2 and packed[0]["freed_ranks"] == [2]
    assert packed[0]["held_until"] == packed[0]["moved_at"] == 4
    assert packed[0]["freed_nodes"] == []  # one node, still in use
    assert [r["rank"] for r in recs if r["kind"] == "freed"] == [2]
    pruning = [r for r in recs if r["kind"] == "pruning"]
    assert [len(r["stage_sparsity"]) for r in pruning] == [3, 3, 2]
    assert all(r["rank"] in (0, 1) for r in recs if r["kind"] == "heartbeat" and r["step"] > 4)
    plan = Plan.model_validate_json((run.dir / "plan.json").read_text())
    assert plan.P == 2 and [b for s in plan.stages for b in s.blocks] == list(range(7))
    kinds = {e["kind"] for e in StateDB(tmp_path).events(run.id)}
    assert "packed" in kinds
