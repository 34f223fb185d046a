"""Zero-bubble schedules train exactly like one process: real multi-process runs of
ZB-H1 (backward split into B and W), with and without recompute, and ZB-V (two
stages per rank) with the eval pass."""

from __future__ import annotations

import pytest
import torch

from jobctl.engine.core.actions import Op
from jobctl.engine.data.dataset import make_eval_data
from jobctl.engine.worker.reference import reference_train

from ..jobrun import events, final_weights, plain_eval
from .test_data_sources import write_tokens
from .test_parity import SGD, STEPS, _run_and_compare, _spec


@pytest.mark.multiproc
@pytest.mark.parametrize("recompute", ["none", "all"])
def test_zb_h1_matches_single_process(tmp_path, recompute):
    spec = _spec(3, 1, "zb_h1", **SGD, **{"parallelism.recompute": recompute})
    run = _run_and_compare(tmp_path, spec, atol=1e-5)
    plan = run.plan
    assert plan.schedule == "zb_h1"
    for st in plan.stages:
        ops = [a.op for a in st.action_list()]
        assert ops.count(Op.WEIGHT) == plan.micro_batches
        assert (Op.RECOMPUTE in ops) == (recompute == "all") == st.recompute


@pytest.mark.multiproc
def test_zb_v_job_matches_single_process(tmp_path):
    # 2 ranks host 4 stages in V shape (rank 0: stages 0 and 3, rank 1: 1 and 2), a
    # real `apply` through the local backend; M = 8 >= 2P - 1, with recompute, on a
    # token file with a held-out split: the eval pass runs both stages of each rank.
    tokens = write_tokens(tmp_path / "tokens.bin")
    spec = _spec(
        2,
        1,
        "zb_v",
        **SGD,
        **{"hardware.nodes": 1, "hardware.processes_per_node": 2, "parallelism.recompute": "all"},
        **{"data.source": "tokens", "data.path": str(tokens), "data.eval": 0.1},
        **{"training.eval_every": STEPS},
    )
    run = _run_and_compare(tmp_path, spec, atol=1e-5)
    evals = [r for r in events(run.dir) if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [STEPS]
    weights, m = final_weights(run.dir, STEPS), run.plan.micro_batch_size
    want = plain_eval(spec, weights, make_eval_data(spec), m)
    assert evals[0]["eval_loss"] == pytest.approx(want, abs=1e-5)
    plan = run.plan
    assert (plan.schedule, plan.P, len(plan.stages)) == ("zb_v", 2, 4)
    assert plan.placement == [[0, 3], [1, 2]]
    for st in plan.stages:
        ops = [a.op for a in st.action_list()]
        assert ops.count(Op.WEIGHT) == ops.count(Op.RECOMPUTE) == plan.micro_batches


@pytest.mark.multiproc
def test_zb_v_with_pruning_matches_single_process(tmp_path):
    # Pruning on V ranks (P = 2 x D = 2): each rank masks its two stages as one, the
    # tied embedding and head (both on rank 0, one Parameter) included; the global
    # selection and its ties follow the model's block order, so the masks in the
    # checkpoint, the losses and the weights are one process's.
    from jobctl.engine.checkpoint.blocks import load_masks

    prunable = ["layers.*.attn.*.weight", "layers.*.mlp.*.weight", "layers.0.wte.weight"]
    pruning = {"pruning.enabled": True, "pruning.prunable": prunable}
    pruning |= {"pruning.start_step": 1, "pruning.end_step": 3, "pruning.frequency": 1}
    pruning |= {"pruning.initial_sparsity": 0.3, "pruning.final_sparsity": 0.7}
    spec = _spec(2, 2, "zb_v", **SGD, **pruning, **{"hardware.processes_per_node": 4})
    ref_masks: dict = {}
    ref_losses, _ = reference_train(spec, masks=ref_masks)
    run = _run_and_compare(tmp_path, spec, atol=1e-5)
    assert run.plan.placement == [[0, 3], [1, 2]] and run.plan.D == 2
    ckpt = run.dir / "checkpoints" / f"step-{STEPS:08d}"
    masks = load_masks(ckpt, list(ref_masks), [])
    assert set(masks) == set(ref_masks) and len(masks) > 8
    assert all(torch.equal(masks[n], m) for n, m in ref_masks.items())
    recs = [r for r in events(run.dir) if r["kind"] == "pruning"]
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert recs[-1]["pruned"] == recs[-1]["k"] > 0
