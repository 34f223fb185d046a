"""One rank of a Mobius pipeline over N processes (gloo), for
``tests/integration/test_mobius_ranks.py``: trains the quickstart model cut into one
block per stage, stage j on rank j % N, and saves its losses and its stages' final
weights to ``OUT/rank-<r>.pt``.

Usage: python -m tests.mobius_ranks RANK WORLD PORT OUT OPTIMIZER STEPS [PLACEMENT]
(PLACEMENT: the rank of each stage, comma-separated; default j % WORLD)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from jobctl.engine.data.dataset import make_data
from jobctl.engine.mobius.runtime import MobiusRunner, SwapConfig
from jobctl.engine.model.blocks import model_def

from .jobrun import tiny_spec

OPTIMIZERS = {
    "sgd": {"training.optimizer": "sgd", "training.lr": 0.3, "training.momentum": 0.9},
    "adamw": {"training.optimizer": "adamw", "training.lr": 0.01},
}


def spec_for(optimizer: str, steps: int):
    return tiny_spec(**{"model.layers": 4, "training.steps": steps, **OPTIMIZERS[optimizer]})


def main(
    rank: int,
    world: int,
    port: int,
    out: Path,
    optimizer: str,
    steps: int,
    placement: tuple[int, ...] | None,
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    spec = spec_for(optimizer, steps)
    mdef = model_def(spec.model, spec.training.seed, 2)
    stages = tuple((i,) for i in range(mdef.num_blocks))
    cfg = SwapConfig(out / "tier", stages, 2, rank=rank, world=world, placement=placement)
    runner = MobiusRunner(mdef, spec.training, make_data(spec), cfg)
    losses = [runner.step(t) for t in range(steps)]
    runner.flush()
    torch.save({"losses": losses, "weights": runner.weights()}, out / f"rank-{rank}.pt")
    runner.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    r, w, p, o, opt, n = sys.argv[1:7]
    where = tuple(int(k) for k in sys.argv[7].split(",")) if len(sys.argv) > 7 else None
    main(int(r), int(w), int(p), Path(o), opt, int(n), where)
