"""The Mobius runtime over N = 2 ranks, six stages placed 0,1,1,0,0,1 (as a cross
mapping may: stages 1-2 and 3-4 share a rank, handed over in memory; the others
cross over gloo): equal to one process, the tied embedding and head (stages 0 and 5,
on different ranks) summed across them; the eval pass over the trained stages equals
a plain forward of the weights they hold."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from jobctl.engine.data.dataset import make_data
from jobctl.engine.supervise.launch import free_port
from jobctl.engine.worker.reference import reference_train

from ..jobrun import plain_eval
from ..mobius_ranks import spec_for

ROOT = Path(__file__).resolve().parents[2]


def _ranks(tmp_path, optimizer: str, steps: int, placement: str, model: str) -> list[dict]:
    """Run ``tests.mobius_ranks`` on 2 gloo ranks; what each rank saved."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "tests.mobius_ranks"]
    args = [str(free_port()), str(tmp_path), optimizer, str(steps), placement, model]
    procs = [subprocess.Popen([*cmd, str(r), "2", *args], cwd=ROOT, env=env) for r in range(2)]
    assert [p.wait(timeout=180) for p in procs] == [0, 0]
    return [torch.load(tmp_path / f"rank-{r}.pt") for r in range(2)]


@pytest.mark.multiproc
def test_two_ranks_train_like_one_process(tmp_path):
    # AdamW: its slots travel with the update on upload (SGD: tests/unit/test_mobius_runtime)
    optimizer = "adamw"
    got = _ranks(tmp_path, optimizer, 3, "0,1,1,0,0,1", "gpt")
    ref_losses, ref_weights = reference_train(spec_for(optimizer, 3), micro_batch=2)
    assert got[1]["losses"] == pytest.approx(ref_losses, abs=1e-5)  # stage 5 on rank 1
    assert got[0]["losses"] == [None] * 3
    weights = {**got[0]["weights"], **got[1]["weights"]}
    assert set(got[0]["weights"]) & set(got[1]["weights"]) == set()
    torch.testing.assert_close(weights["layers.5.weight"], weights["layers.0.wte.weight"])
    for name, w in ref_weights.items():
        # Adam: the attention key bias' rounding noise, as in tests/integration/test_parity.py.
        atol = 5e-4 if optimizer == "adamw" and name.endswith("qkv.bias") else 1e-5
        torch.testing.assert_close(weights[name], w, atol=atol, rtol=0, msg=name)
    assert got[0]["eval"] is None
    spec = spec_for(optimizer, 3)
    want = plain_eval(spec, weights, make_data(spec), 2)
    assert got[1]["eval"] == pytest.approx(want, abs=1e-6)


@pytest.mark.multiproc
def test_a_traced_hugging_face_llama_trains_like_one_process(tmp_path):
    # S = 4 stages on 2 ranks (0, 1, 0, 1): the carriers between the traced subgraphs
    # hold several values (hidden states, position embeddings, masks); their layout
    # goes once, then one tensor per micro-batch, as between resident stages.
    got = _ranks(tmp_path, "adamw", 3, "-", "llama")
    spec = spec_for("adamw", 3, "llama")
    ref_losses, ref_weights = reference_train(spec, micro_batch=2)
    assert got[1]["losses"] == pytest.approx(ref_losses, abs=1e-5)  # stage 3 on rank 1
    weights = {**got[0]["weights"], **got[1]["weights"]}
    assert set(weights) == set(ref_weights)
    for name, w in ref_weights.items():
        torch.testing.assert_close(weights[name], w, atol=1e-5, rtol=0, msg=name)
    want = plain_eval(spec, weights, make_data(spec), 2)
    assert got[1]["eval"] == pytest.approx(want, abs=1e-6)


@pytest.mark.multiproc
def test_fp16_skips_the_steps_grad_scaler_skips(tmp_path):
    # One loss scale S over the swapped stages: each stage unscales its gradients
    # before they go down, the ranks agree on an overflow and skip that step's update
    # (which would run on each stage's next upload) together. Against the one-process
    # torch.amp.GradScaler loop, at test_parity's fp16 tolerances.
    got = _ranks(tmp_path, "sgd", 4, "-", "gpt-fp16")
    skipped: list[int] = []
    spec = spec_for("sgd", 4, "gpt-fp16")
    ref_losses, ref_weights = reference_train(spec, micro_batch=2, skipped=skipped)
    assert skipped and len(skipped) < 4  # it overflows, and it trains
    assert got[0]["skipped"] == got[1]["skipped"] == skipped
    assert got[1]["losses"] == pytest.approx(ref_losses, rel=1e-4)
    weights = {**got[0]["weights"], **got[1]["weights"]}
    for name, w in ref_weights.items():
        torch.testing.assert_close(weights[name], w, atol=5e-4, rtol=0, msg=name)
