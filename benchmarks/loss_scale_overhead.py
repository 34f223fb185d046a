"""What fp16's loss scale adds to a step (engine/runtime/loss_scale.py), measured.

Two gloo ranks, each holding the gradients of one stage of the quickstart model (2
stages of 6 blocks), take turns over ``--rounds`` rounds of: the stage's gradient
all-reduce over its replicas (what a D = 2 step already pays), the scaler's unscale
and inf/NaN check (GradScaler's fused kernel) and the found-inf MAX all-reduce that
an fp16 run without a step commit adds (with a commit the flag rides in it: no extra
round trip). Prints each one's median per step and the scale's share of the sum.

    python -m benchmarks.loss_scale_overhead [--rounds 300]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from jobctl.engine.core.process import free_port
from jobctl.engine.model.blocks import Stage, model_def
from jobctl.engine.runtime.loss_scale import LossScaler, agree_found_inf
from jobctl.engine.runtime.optim import allreduce_grads
from tests.jobrun import tiny_spec


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _rank(rank: int, port: int, rounds: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    spec = tiny_spec()
    stage = Stage(model_def(spec.model, 0, 2), [0, 1, 2])  # the first stage's blocks
    params = list(stage.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    scaler = LossScaler()
    times: dict[str, list[float]] = {"gradient all-reduce": [], "unscale+check": [], "flag": []}
    world = dist.group.WORLD
    for _ in range(rounds):
        dist.barrier()
        times["gradient all-reduce"].append(_timed(lambda: allreduce_grads(params, world)))
        scaler.scale = 1.0  # keep the gradients' magnitude round after round
        times["unscale+check"].append(_timed(lambda: scaler.unscale(params)))
        times["flag"].append(_timed(lambda: agree_found_inf(False)))
    if rank == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        for k, v in med.items():
            print(f"{k:>20}: {v * 1e6:8.0f} us")
        added = med["unscale+check"] + med["flag"]
        n = sum(p.numel() for p in params)
        print(
            f"{n} parameters; the loss scale adds {added * 1e6:.0f} us, "
            f"{added / med['gradient all-reduce']:.2f}x the gradient all-reduce"
        )
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    mp.spawn(_rank, args=(free_port(), args.rounds), nprocs=2)


if __name__ == "__main__":
    main()
