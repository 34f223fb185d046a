"""Tensor parallelism (Merak 4.1) at T = 2 against T = 1 on one traced GPT-2 stage,
and sub-pipelined TMP (Merak 5.3) against plain TMP on the same T = 2 layout.

Two gloo ranks with one thread each. Every round runs, in turn, the whole model as
one process (rank 0 computes while rank 1 waits at a barrier) and the same model
split over both ranks by ``tp_stage.parallelize`` (each rank half of every
attention and MLP linear, Megatron's two all-reduces per layer forward and two
backward); a step is forward and backward of one micro-batch. The figure is the
median over rounds of each round's median step, and their ratio; the time the T = 2
step spends in its all-reduces is timed by the same step with the collectives
skipped (wrong numbers, same compute), so ``comm`` is the difference.

``T=2 sub`` runs the same split model sub-pipelined (``tp_stage.subpipeline``: each
micro-batch as two halves through the m/2 trace, one half's all-reduces in flight
while the other computes); ``sub/plain`` is each round's plain T = 2 step over its
sub-pipelined one (above 1: sub-pipelining is faster), as median [min, max] over the
rounds. ``T=2 sub no comm`` prices the halves' compute alone (two half-size calls and
the interpreter), so the overlap's share of the difference can be read off.

    python -m benchmarks run tensor_parallel [--width 512] [--layers 2] [--seq 128]

The machine has 2 cores shared with other work: absolute times are noisy; the ratio
is the figure to read, and 2 ranks here are 2 cores, not 2 accelerators.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.lib.benchlib import free_port
from jobctl.engine.model.graph import tp_stage
from jobctl.engine.model.graph.graph_def import GraphModel
from jobctl.engine.model.graph.source import GraphModelConfig
from jobctl.engine.model.graph.tp_plan import discover

QUESTION = (
    "What does tensor parallelism at T = 2 gain on one traced GPT-2 stage, and "
    "sub-pipelined TMP over plain TMP?"
)
BASELINE = (
    "The whole model in one process (T = 1), and the T = 2 step with its collectives skipped."
)

MICRO = 4
KEYS = ("T=1", "T=2", "T=2 no comm", "T=2 sub", "T=2 sub no comm")


def _graph(args) -> GraphModel:
    config = {
        "n_layer": args.layers,
        "n_embd": args.width,
        "n_head": 8,
        "vocab_size": 512,
        "n_positions": args.seq,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    }
    cfg = GraphModelConfig(hf_class="GPT2LMHeadModel", hf_config=config, seq_len=args.seq)
    return GraphModel(cfg, MICRO)


def _step(blocks, batch) -> float:
    start = time.perf_counter()
    carry: tuple = ()
    for b in blocks:
        carry = b.run(carry, batch)
    carry[0].backward()
    return time.perf_counter() - start


def _median_step(blocks, batch, steps: int) -> float:
    _step(blocks, batch)  # warm-up
    return statistics.median(_step(blocks, batch) for _ in range(steps))


class _Done:
    def wait(self) -> None:
        return None


def _no_comm(x, group=None, async_op=False):
    return _Done() if async_op else x


def _worker(rank: int, port: int, args) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=600),
    )
    graph = _graph(args)
    mesh = tp_stage.tp_mesh(1, 1, 2)
    plan = discover(graph, 2)
    whole = [graph.block(i, seed=0) for i in range(len(graph.shards))]
    split = [graph.block(i, seed=0) for i in range(len(graph.shards))]
    for b in split:
        tp_stage.parallelize(b, plan, mesh["tp"])
    half = GraphModel(graph.cfg, MICRO // 2)
    half = (half, discover(half, 2))
    sub = [graph.block(i, seed=0) for i in range(len(graph.shards))]
    for i, b in enumerate(sub):
        tp_stage.parallelize(b, plan, mesh["tp"])
        tp_stage.subpipeline(b, i, graph, half, plan, mesh["tp"])
    x = torch.randint(0, 512, (MICRO, args.seq), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": x, "labels": x}
    rounds: dict[str, list[float]] = {k: [] for k in KEYS}
    for _ in range(args.rounds):
        dist.barrier()
        if rank == 0:
            rounds["T=1"].append(_median_step(whole, batch, args.steps))
        dist.barrier()
        rounds["T=2"].append(_median_step(split, batch, args.steps))
        dist.barrier()
        rounds["T=2 no comm"].append(_skipping_comm(split, batch, args.steps))
        dist.barrier()
        rounds["T=2 sub"].append(_median_step(sub, batch, args.steps))
        dist.barrier()
        rounds["T=2 sub no comm"].append(_skipping_comm(sub, batch, args.steps))
    if rank == 0:
        _print({k: statistics.median(v) for k, v in rounds.items()}, args)
        ratios = [p / s for p, s in zip(rounds["T=2"], rounds["T=2 sub"], strict=True)]
        print(
            f"sub/plain (plain T=2 step / sub-pipelined): median "
            f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}] "
            f"over {len(ratios)} rounds"
        )
    dist.destroy_process_group()


def _skipping_comm(blocks, batch, steps: int) -> float:
    saved = tp_stage.dist.all_reduce  # one torch.distributed module: both modules' name
    tp_stage.dist.all_reduce = _no_comm  # both ranks skip: no collective to match
    try:
        return _median_step(blocks, batch, steps)
    finally:
        tp_stage.dist.all_reduce = saved


def _print(t: dict, args) -> None:
    print(
        f"GPT-2 {args.layers} layers, width {args.width}, seq {args.seq}, micro-batch "
        f"{MICRO}; median of {args.rounds} rounds x {args.steps} steps (F+B)"
    )
    print(f"{'layout':<18}{'step ms':>10}{'vs T=1':>10}")
    for k in KEYS:
        print(f"{k:<18}{1e3 * t[k]:>10.1f}{t['T=1'] / t[k]:>9.2f}x")
    comm = t["T=2"] - t["T=2 no comm"]
    print(
        f"T=2 all-reduces: {1e3 * comm:.1f} ms a step ({comm / t['T=2']:.0%} of it; "
        f"compute {1e3 * t['T=2 no comm']:.1f} ms)"
    )
    sub_comm = t["T=2 sub"] - t["T=2 sub no comm"]
    print(
        f"T=2 sub: halves' compute {1e3 * t['T=2 sub no comm']:.1f} ms, exposed "
        f"all-reduce {1e3 * sub_comm:.1f} ms a step"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(free_port(), args), nprocs=2, join=True)


if __name__ == "__main__":
    main()
