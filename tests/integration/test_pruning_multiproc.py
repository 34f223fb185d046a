"""Pruning across real gloo processes: parity with one process, replica agreement, resume."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from jobctl.engine.checkpoint.blocks import load_masks
from jobctl.engine.core.plan import Plan
from jobctl.engine.model.blocks import Stage, model_def
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.pruning.pruner import Pruner, prunable_names
from jobctl.engine.pruning.selection import count_to_prune, select_single
from jobctl.engine.runtime.optim import build_optimizer
from jobctl.engine.runtime.topology import build_topology
from jobctl.engine.state.db import StateDB
from jobctl.engine.worker.reference import reference_train
from jobctl.spec import load_spec

from ..jobrun import ROOT, events, final_weights, run_job, step_losses

PRUNING_YAML = ROOT / "jobs" / "pruning.yaml"
STEPS = 8
SCHEDULE = {
    "training.steps": STEPS,
    "pruning.start_step": 2,
    "pruning.end_step": 6,
    "pruning.frequency": 2,
    "pruning.initial_sparsity": 0.2,
}
WITH_EMBEDDING = ["layers.*.attn.*.weight", "layers.*.mlp.*.weight", "layers.0.wte.weight"]


def _spec(P: int, D: int, **extra):
    overrides = {
        **SCHEDULE,
        "hardware.processes_per_node": P * D,
        "parallelism.pipeline_stages": P,
        "parallelism.data_parallel": D,
        **extra,
    }
    return load_spec(PRUNING_YAML, overrides=overrides)


@pytest.mark.multiproc
def test_pipeline_pruning_matches_single_process(tmp_path):
    # SGD keeps the weights comparable to 1e-5 (see test_parity); the tied embedding is
    # prunable too, so its mask must reach the head on the last stage.
    sgd = {"training.optimizer": "sgd", "training.lr": 0.3, "training.momentum": 0.9}
    every_pruning = {"checkpoint.interval": 2, "checkpoint.keep_last": 4}  # right after each
    spec = _spec(2, 2, **sgd, **every_pruning, **{"pruning.prunable": WITH_EMBEDDING})
    ref_masks: dict = {}
    ref_losses, ref_weights = reference_train(spec, masks=ref_masks)
    run, outcome = run_job(spec, tmp_path)
    assert outcome.ok, outcome.message
    assert step_losses(run.dir) == pytest.approx(ref_losses, abs=1e-5)
    weights = final_weights(run.dir, STEPS)
    for name, w in ref_weights.items():
        torch.testing.assert_close(weights[name], w, atol=1e-5, rtol=0, msg=name)
    ckpt = run.dir / "checkpoints" / f"step-{STEPS:08d}"
    masks = load_masks(ckpt, list(weights) + ["layers.5.weight"], spec_ties(spec))
    assert set(ref_masks) <= set(masks)
    for name, m in ref_masks.items():
        assert torch.equal(masks[name], m), name
    assert torch.equal(masks["layers.5.weight"], masks["layers.0.wte.weight"])

    recs = events(run.dir)
    pruning = [r for r in recs if r["kind"] == "pruning"]
    assert [r["step"] for r in pruning] == [2, 4, 6]
    total = pruning[0]["prunable"]
    for r in pruning:  # the schedule's sparsity exactly, globally
        assert r["pruned"] == count_to_prune(r["target_sparsity"], total)
        assert len(r["stage_sparsity"]) == 2
    assert [round(r["target_sparsity"], 4) for r in pruning] == [0.2, 0.8125, 0.9]
    profiles = [r for r in recs if r["kind"] == "profile"]
    assert sorted((r["step"], r["rank"]) for r in profiles) == [
        (s, k) for s in (3, 5, 7) for k in range(4)
    ]
    for r in profiles:
        assert all(b["fwd_s"] > 0 and b["bwd_s"] > 0 for b in r["blocks"].values())
    phases = [e["message"] for e in StateDB(tmp_path).events(run.id) if e["kind"] == "phase"]
    assert sum(p.startswith("pruning: step") for p in phases) == 3
    assert sum(p.startswith("training: profiled step") for p in phases) == 3
    _assert_realised_sparsity(run.dir, pruning, spec_ties(spec))


@pytest.mark.multiproc
def test_pruning_at_T2_matches_single_process_and_resumes_at_T1(tmp_path):
    """Pruning under tensor parallelism (T = 2 x P = 2, the builtin GPT's Megatron
    split): the selection sees whole weights, so the losses, final weights and the
    checkpoints' whole masks are one process's; the T = 2 checkpoint resumes at T = 1."""
    sgd = {"training.optimizer": "sgd", "training.lr": 0.3, "training.momentum": 0.9}
    extra = {
        "parallelism.tensor_parallel": 2,
        "hardware.processes_per_node": 4,
        "checkpoint.interval": 2,
        "checkpoint.keep_last": 4,
    }
    spec = _spec(2, 1, **sgd, **extra, **{"pruning.prunable": WITH_EMBEDDING})
    ref_masks: dict = {}
    ref_losses, ref_weights = reference_train(spec, masks=ref_masks)
    run, outcome = run_job(spec, tmp_path / "t2")
    assert outcome.ok, outcome.message
    assert (run.plan.T, run.plan.P, run.plan.world_size) == (2, 2, 4)
    assert step_losses(run.dir) == pytest.approx(ref_losses, abs=1e-5)
    weights = final_weights(run.dir, STEPS)
    for name, w in ref_weights.items():
        torch.testing.assert_close(weights[name], w, atol=1e-5, rtol=0, msg=name)
    ckpt = run.dir / "checkpoints" / f"step-{STEPS:08d}"
    masks = load_masks(ckpt, list(ref_masks), spec_ties(spec))
    assert set(masks) == set(ref_masks)
    assert all(torch.equal(masks[n], m) for n, m in ref_masks.items())
    pruning = [r for r in events(run.dir) if r["kind"] == "pruning"]
    assert [r["step"] for r in pruning] == [2, 4, 6]
    _assert_realised_sparsity(run.dir, pruning, spec_ties(spec))
    at_t1 = _spec(2, 1, **sgd, **{"checkpoint.interval": 4, "pruning.prunable": WITH_EMBEDDING})
    ckpt4 = run.dir / "checkpoints" / "step-00000004"
    resumed, outcome = run_job(at_t1, tmp_path / "t1", resume_dir=ckpt4)
    assert outcome.ok, outcome.message
    assert step_losses(resumed.dir) == pytest.approx(ref_losses[4:], abs=1e-5)


def _assert_realised_sparsity(run_dir, pruning: list[dict], ties) -> None:
    """At every pruning step (checkpointed right after it), per layer: the zeros in the
    weights are exactly the pruned elements, the recorded sparsity is theirs, nothing
    below the global threshold survives anywhere (Alg. 2), and what was pruned stays
    pruned; globally exactly round(s N) elements are gone."""
    prev: dict = {}
    for r in pruning:
        weights = final_weights(run_dir, r["step"])
        names = prunable_names(list(weights), WITH_EMBEDDING, ties)
        masks = load_masks(run_dir / "checkpoints" / f"step-{r['step']:08d}", names, ties)
        pruned = {n: int((~masks[n]).sum()) for n in names}
        assert sum(pruned.values()) == count_to_prune(r["target_sparsity"], r["prunable"])
        assert abs(sum(pruned.values()) - r["target_sparsity"] * r["prunable"]) <= 0.5
        for n in names:
            w, m = weights[n], masks[n]
            assert int((w == 0).sum()) == pruned[n], n
            assert r["layer_sparsity"][n] == pytest.approx(pruned[n] / m.numel()), n
            assert bool((w[m].abs() >= r["threshold"]).all()), n
            assert n not in prev or not bool((m & ~prev[n]).any()), n
        prev = masks


def spec_ties(spec):
    return model_def(spec.model, spec.training.seed).ties


@pytest.mark.multiproc
def test_resume_after_pruning_keeps_masks_and_losses(tmp_path):
    spec = _spec(3, 1, **{"checkpoint.interval": 4})  # 3 stages: gloo groups of 3 ranks
    run, outcome = run_job(spec, tmp_path / "whole")
    assert outcome.ok, outcome.message
    ckpt4 = run.dir / "checkpoints" / "step-00000004"
    other = _spec(1, 2, **{"checkpoint.interval": 4})
    resumed, outcome = run_job(other, tmp_path / "resumed", resume_dir=ckpt4)
    assert outcome.ok, outcome.message
    assert step_losses(resumed.dir) == pytest.approx(step_losses(run.dir)[4:], abs=1e-5)
    names = list(final_weights(run.dir, STEPS))
    end = f"step-{STEPS:08d}"
    a = load_masks(run.dir / "checkpoints" / end, names, [])
    b = load_masks(resumed.dir / "checkpoints" / end, names, [])
    assert a and set(a) == set(b)
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert [r["step"] for r in events(resumed.dir) if r["kind"] == "pruning"] == [6]


# -- replicas agree (direct gloo processes, replica 1 perturbed) ---------------------
def _replica_worker(rank: int, world: int, store_path: str, spec, out_path: str, everyone: bool):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    try:
        plan = make_plan(spec, world)
        mdef = model_def(spec.model, spec.training.seed)
        topo = build_topology(plan, rank, bool(mdef.ties))
        stage = Stage(mdef, plan.stage_of(rank).blocks)
        if topo.replica == 1:  # drifted replica: its own masks would differ
            with torch.no_grad():
                for p in stage.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
        named = dict(stage.named_parameters())
        opt = build_optimizer(list(named.values()), spec.training)
        pruner = Pruner(spec, stage, named, opt, topo, mdef.ties)
        if everyone:  # as after packing: no group of replica 0's pipeline, all ranks gather
            pruner.selectors.key = None
        rec = pruner.maybe_prune(6)
        got = [None] * world
        dist.all_gather_object(got, (topo.replica, pruner.masks, rec))
        if rank == 0:
            torch.save(got, out_path)
    finally:
        dist.destroy_process_group()


@pytest.mark.multiproc
@pytest.mark.parametrize("everyone", [False, True])
def test_masks_identical_across_replicas_and_equal_to_assembled_model(tmp_path, everyone):
    spec = _spec(2, 2, **{"pruning.prunable": WITH_EMBEDDING})
    out = tmp_path / "masks.pt"
    args = (4, str(tmp_path / "store"), spec, str(out), everyone)
    mp.spawn(_replica_worker, args=args, nprocs=4, join=True)
    got = torch.load(out, weights_only=False)
    by_replica: dict[int, dict] = {0: {}, 1: {}}
    for replica, masks, _ in got:
        by_replica[replica].update(masks)
    assert set(by_replica[0]) == set(by_replica[1])
    assert all(torch.equal(by_replica[0][n], by_replica[1][n]) for n in by_replica[0])
    # The assembled model (replica 0's unperturbed weights) pruned in one process.
    mdef = model_def(spec.model, spec.training.seed)
    whole = Stage(mdef, range(mdef.num_blocks))
    params = dict(whole.named_parameters())
    names = prunable_names(list(params), WITH_EMBEDDING, mdef.ties)
    ref, k, total, _ = select_single({n: params[n].detach() for n in names}, 0.9)
    for n, m in ref.items():
        assert torch.equal(by_replica[0][n], m), n
    assert torch.equal(by_replica[0]["layers.5.weight"], ref["layers.0.wte.weight"])  # alias
    recs = [r for _, _, r in got]
    assert all(r["k"] == k == count_to_prune(0.9, total) for r in recs)
    assert all(r["pruned"] == k for r in recs)


@pytest.mark.multiproc
def test_pruning_a_traced_llama_at_T2_matches_single_process(tmp_path):
    """The same on a Hugging Face Llama split by its traced graph's plan
    (``model.graph.tp_stage``): its MLP linears pruned on the T group's whole weights."""
    from .test_graph_models import LLAMA, hf_spec, run_and_compare

    schedule = {**SCHEDULE, "pruning.enabled": True, "training.steps": 6, "pruning.end_step": 4}
    tp = {"parallelism.tensor_parallel": 2, "hardware.processes_per_node": 2}
    run = run_and_compare(tmp_path, hf_spec(LLAMA, 1, 1, **schedule, **tp))
    assert run.plan.T == 2
    pruning = [r for r in events(run.dir) if r["kind"] == "pruning"]
    assert [r["step"] for r in pruning] == [2, 4] and pruning[-1]["achieved_sparsity"] > 0.5


@pytest.mark.multiproc
def test_pruning_and_rebalancing_under_mobius_with_eval_match_single_process(tmp_path):
    """Mobius (S = 4 stages swapped through files on 2 ranks) with pruning, rebalancing
    and the eval pass: the selection runs over every rank's records (stage j on rank
    j % 2, so each rank's blocks are not contiguous), the masks are one process's, each
    update on upload keeps them; after each profiled step the balancer re-cuts the S
    stages by nonzero counts, blocks (weights, slots, masks) change rank, and the run
    still trains as one process; the checkpoints (with their masks) resume under 1F1B."""
    from jobctl.engine.data.dataset import make_eval_data

    from ..jobrun import plain_eval, tiny_spec
    from .test_data_sources import write_tokens

    tokens = write_tokens(tmp_path / "tokens.bin")
    fields = {**SCHEDULE, "pruning.enabled": True, "pruning.prunable": WITH_EMBEDDING}
    fields |= {"training.steps": 6, "pruning.end_step": 4, "checkpoint.interval": 2}
    fields |= {"data.source": "tokens", "data.path": str(tokens), "data.eval": 0.1}
    # SGD keeps weights comparable to 1e-5 (Adam turns the k-bias' rounding-noise
    # gradient into whole steps); momentum rides in each record's slot
    fields |= {"training.eval_every": 3, "training.optimizer": "sgd", "training.lr": 0.3}
    fields |= {"training.momentum": 0.9}
    fields |= {"rebalancing.enabled": True, "rebalancing.by": "params"}
    one_node = {"hardware.nodes": 1, "hardware.processes_per_node": 2}
    mobius = {"parallelism.schedule": "mobius", "parallelism.pipeline_stages": 4}
    spec = tiny_spec(**fields, **one_node, **mobius, **{"parallelism.data_parallel": 1})
    ref_masks: dict = {}
    ref_losses, ref_weights = reference_train(spec, masks=ref_masks)
    run, outcome = run_job(spec, tmp_path / "mobius")
    assert outcome.ok, outcome.message
    assert run.plan.mobius is not None and len(run.plan.mobius.stages) == 4
    assert step_losses(run.dir) == pytest.approx(ref_losses, abs=1e-5)
    weights = final_weights(run.dir, 6)
    for name, w in ref_weights.items():
        torch.testing.assert_close(weights[name], w, atol=1e-5, rtol=0, msg=name)
    masks = load_masks(run.dir / "checkpoints" / "step-00000006", list(ref_masks), [])
    assert set(masks) == set(ref_masks) and all(torch.equal(masks[n], ref_masks[n]) for n in masks)
    for f in (run.dir / "checkpoints" / "step-00000006").glob("block-*.pt"):
        optim = torch.load(f, weights_only=True)["optim"]  # pruned gradients were masked
        for n in set(optim) & set(masks):
            assert not optim[n]["momentum_buffer"][~masks[n]].any(), n
    recs = events(run.dir)
    assert [r["step"] for r in recs if r["kind"] == "pruning"] == [2, 4]
    _assert_re_cut(run, recs)
    evals = [r for r in recs if r["kind"] == "eval"]
    m = run.plan.micro_batch_size
    assert [r["step"] for r in evals] == [3, 6]
    want = plain_eval(spec, weights, make_eval_data(spec), m)
    assert evals[-1]["eval_loss"] == pytest.approx(want, abs=1e-5)
    at_1f1b = tiny_spec(**fields, **one_node, **{"parallelism.data_parallel": 1})
    ckpt = run.dir / "checkpoints" / "step-00000002"
    resumed, outcome = run_job(at_1f1b, tmp_path / "1f1b", resume_dir=ckpt)
    assert outcome.ok, outcome.message
    assert step_losses(resumed.dir) == pytest.approx(ref_losses[2:], abs=1e-5)


def _assert_re_cut(run, recs: list[dict]) -> None:
    """The Mobius run re-cut its stages after a profiled step, on the same ranks, and
    measured the new cut; plan.json holds the last cut."""
    moved = [r for r in recs if r["kind"] == "rebalanced"]
    assert moved and all(r["step"] in (3, 5) for r in moved), recs
    first = moved[0]
    assert first["stages_before"] == run.plan.mobius.stages
    assert first["stages_after"] != first["stages_before"] and first["moves"]
    assert max(first["load_after"]) < max(first["load_before"])
    measured = [r for r in recs if r["kind"] == "rebalance_measured"]
    assert [r["step"] for r in measured] == [r["step"] + 1 for r in moved]
    now = Plan.model_validate_json((run.dir / "plan.json").read_text())
    assert now.mobius.stages == moved[-1]["stages_after"]
    assert now.mobius.ranks == run.plan.mobius.ranks
