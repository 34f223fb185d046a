"""A Mobius run under a per-process memory budget, in a process of its own: prints
one JSON line with the training state's bytes, the budget, and the resident memory
the runner added at its peak (``tests/integration/test_mobius_budget.py`` reads it).

Usage: python -m tests.mobius_budget FOLDER OPTIMIZER [STEPS]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from jobctl.engine.data.dataset import make_data
from jobctl.engine.mobius import memory
from jobctl.engine.mobius.runtime import MobiusRunner, SwapConfig
from jobctl.engine.model.blocks import model_def

from .jobrun import tiny_spec

#: 12 blocks of hidden 256: each transformer block is 0.79 M parameters.
SHAPE = {"model.layers": 10, "model.hidden": 256, "model.heads": 4, "model.vocab": 256}


def main(folder: Path, optimizer: str, steps: int) -> dict:
    torch.set_num_threads(1)
    extra = {"training.momentum": 0.9} if optimizer == "sgd" else {}
    spec = tiny_spec(**SHAPE, **extra, **{"training.optimizer": optimizer, "training.lr": 0.01})
    mdef = model_def(spec.model, spec.training.seed, 2)
    stages = tuple((i,) for i in range(mdef.num_blocks))
    data = make_data(spec)
    data.batch(0, 2)  # the data source's own buffers belong to the baseline
    warm = torch.nn.Linear(8, 8)  # torch's lazy start-up (autograd, optimizers) too
    opt = torch.optim.AdamW(warm.parameters())
    warm(torch.zeros(2, 8)).sum().backward()
    opt.step()
    sections = 4 if optimizer == "adamw" else 3
    state = sum(p.numel() for i in range(mdef.num_blocks) for p in mdef.block(i).parameters())
    state_bytes = state * 4 * sections
    budget = state_bytes // 3
    memory.reset_peak()
    base = memory.rss_bytes()
    cfg = SwapConfig(folder, stages, micro_batch=2, budget_bytes=budget)
    runner = MobiusRunner(mdef, spec.training, data, cfg)
    losses = [runner.step(t) for t in range(steps)]
    peak = memory.peak_bytes() - base
    reserved = sum(b.numel() * 4 for b in runner.reserved.buffers)
    runner.close()
    return {
        "state_bytes": state_bytes,
        "budget": budget,
        "peak": peak,
        "reserved": reserved,
        "losses": losses,
    }


if __name__ == "__main__":
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    print(json.dumps(main(Path(sys.argv[1]), sys.argv[2], steps)))
