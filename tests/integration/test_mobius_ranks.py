"""The Mobius runtime over N = 2 ranks, six stages placed 0,1,1,0,0,1 (as a cross
mapping may: stages 1-2 and 3-4 share a rank, handed over in memory; the others
cross over gloo): equal to one process, the tied embedding and head (stages 0 and 5,
on different ranks) summed across them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from jobctl.engine.supervise.launch import free_port
from jobctl.engine.worker.reference import reference_train

from ..mobius_ranks import spec_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.multiproc
def test_two_ranks_train_like_one_process(tmp_path):
    # AdamW: its slots travel with the update on upload (SGD: tests/unit/test_mobius_runtime)
    optimizer = "adamw"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    port = free_port()
    cmd = [sys.executable, "-m", "tests.mobius_ranks"]
    args = [str(port), str(tmp_path), optimizer, "3", "0,1,1,0,0,1"]
    procs = [subprocess.Popen([*cmd, str(r), "2", *args], cwd=ROOT, env=env) for r in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    got = [torch.load(tmp_path / f"rank-{r}.pt") for r in range(2)]
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
