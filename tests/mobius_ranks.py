"""One rank of a Mobius pipeline over N processes (gloo), for
``tests/integration/test_mobius_ranks.py``: trains the quickstart model cut into one
block per stage (or a traced Hugging Face Llama as 4 stages), stage j on rank j % N,
evaluates the trained model on the batch [0, B) of the training stream
(``MobiusRunner.evaluate``, forward only) and saves its losses, that eval loss and
its stages' final weights to ``OUT/rank-<r>.pt``.

Usage: python -m tests.mobius_ranks RANK WORLD PORT OUT OPTIMIZER STEPS [PLACEMENT [MODEL]]
(PLACEMENT: the rank of each stage, comma-separated, or - for j % WORLD; MODEL: gpt,
the default; gpt-fp16, the same in fp16 from a loss scale that overflows; or llama:
jobs/hf-llama.yaml's Hugging Face LlamaForCausalLM, traced)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from jobctl.engine.data.dataset import make_data
from jobctl.engine.mobius.runtime import MobiusRunner, SwapConfig
from jobctl.engine.model.blocks import model_def
from jobctl.engine.runtime.loss_scale import loss_scaler
from jobctl.spec import load_spec

from .jobrun import ROOT, tiny_spec

HF_LLAMA = ROOT / "jobs" / "hf-llama.yaml"

OPTIMIZERS = {
    "sgd": {"training.optimizer": "sgd", "training.lr": 0.3, "training.momentum": 0.9},
    "adamw": {"training.optimizer": "adamw", "training.lr": 0.01},
}


#: test_parity's fp16 case: at S = 2**22 the first steps overflow and S backs off.
FP16 = {"training.precision": "fp16", "training.loss_scale.init_scale": 2.0**22}


def spec_for(optimizer: str, steps: int, model: str = "gpt"):
    if model == "gpt-fp16":
        return tiny_spec(
            **{"model.layers": 4, "training.steps": steps, **OPTIMIZERS[optimizer], **FP16}
        )
    if model == "llama":
        return load_spec(HF_LLAMA, overrides={"training.steps": steps, **OPTIMIZERS[optimizer]})
    return tiny_spec(**{"model.layers": 4, "training.steps": steps, **OPTIMIZERS[optimizer]})


def main(
    rank: int,
    world: int,
    port: int,
    out: Path,
    optimizer: str,
    steps: int,
    placement: tuple[int, ...] | None,
    model: str = "gpt",
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    spec = spec_for(optimizer, steps, model)
    mdef = model_def(spec.model, spec.training.seed, 2)
    # GPT: one block per stage; the Llama's 6 subgraphs as S = 4 stages (2, 2, 1, 1)
    cuts = [0, 2, 4, 5, 6] if model == "llama" else list(range(mdef.num_blocks + 1))
    stages = tuple(tuple(range(a, b)) for a, b in zip(cuts, cuts[1:], strict=False))
    cfg = SwapConfig(out / "tier", stages, 2, rank=rank, world=world, placement=placement)
    scaler = loss_scaler(spec.training)
    runner = MobiusRunner(mdef, spec.training, make_data(spec), cfg, scaler=scaler)
    losses, skipped = [], []
    for t in range(steps):
        losses.append(runner.step(t))
        if scaler is not None and scaler.skipped:
            skipped.append(t)
    evaluated = runner.evaluate(make_data(spec))  # applies the last step's update first
    runner.flush()
    got = {"losses": losses, "eval": evaluated, "weights": runner.weights(), "skipped": skipped}
    torch.save(got, out / f"rank-{rank}.pt")
    runner.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    r, w, p, o, opt, n = sys.argv[1:7]
    given = sys.argv[7] if len(sys.argv) > 7 else "-"
    where = None if given == "-" else tuple(int(k) for k in given.split(","))
    main(int(r), int(w), int(p), Path(o), opt, int(n), where, *sys.argv[8:9])
