"""ZB-V on jobctl's runtime parts against PyTorch's two-stages-per-rank schedules.

This measures the runtime parts a ZB-V job runs, without the job around them
(``schedule_throughput`` runs ``zb_v`` as a real job): per rank a ``StepExecutor``
per stage under ``TwoStageExecutor``, ``train_step`` with the optimizer, gloo between
ranks (as PyTorch). Against it, on the same 2P-stage partition (jobctl's planner's),
model, data, micro-batching and optimizer: ``torch.distributed.pipelining``'s
ScheduleZBVZeroBubble, ScheduleInterleavedZeroBubble and ScheduleInterleaved1F1B
(``torch_pipeline_worker``). Every configuration runs ``--rounds`` times in
interleaved order, each time as the least disturbed of up to ``--attempts`` runs
started when the CPU was quiet; a configuration's figure is the median over rounds of
its median step time after warm-up (the whole optimizer step, on the last stage's rank).

    python -m benchmarks run zb_v_runtime [--stages 2] [--micro-batches 8] [--rounds 3]

The machine has 2 cores shared with other work: absolute times are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks.lib import jobbench
from benchmarks.lib.benchlib import launch_ranks, least_disturbed
from benchmarks.lib.jobbench import job_spec, layout
from benchmarks.lib.torch_pipeline_worker import run_baseline
from jobctl.engine.planner.resolver import make_plan
from jobctl.spec import dump_yaml, load_spec

QUESTION = "How fast is ZB-V on jobctl's runtime parts, without the job around them?"
BASELINE = "PyTorch's two-stages-per-rank schedules on the same 2P-stage partition."

MODEL = {"model.hidden": 96, "model.layers": 4, "model.seq_len": 48, "model.heads": 4}
TORCH = ["zbv", "interleaved_zb", "interleaved_1f1b"]


def _spec(P: int, M: int, m: int, steps: int):
    return job_spec(
        **MODEL,
        **{
            "model.tie_embeddings": False,  # as PyTorch's schedules: no tied sum
            "training.steps": steps,
            "training.global_batch_size": M * m,
            "hardware.nodes": 1,
            "hardware.processes_per_node": P,
        },
        **layout(P, 1, m, "1f1b"),
    )


def run_jobctl(spec_yaml: str, stages: list[list[int]], M: int, steps: int, work: Path):
    """Start one process per rank (two stages each); returns the step seconds."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "spec.yaml").write_text(spec_yaml)
    job = {"spec": str(work / "spec.yaml"), "stages": stages, "micro_batches": M, "steps": steps}
    args = ["-m", "benchmarks.runtime.zb_v_runtime", "--worker"]
    return launch_ranks(args, job, len(stages) // 2, work, "jobctl zb_v run")


def worker(job: dict) -> None:
    """One rank: its two stages of the V, timed per optimizer step."""
    from jobctl.engine.data.dataset import Sharding, make_data
    from jobctl.engine.model.blocks import Stage, model_def
    from jobctl.engine.runtime.executor import Channels, StepExecutor
    from jobctl.engine.runtime.optim import build_optimizer
    from jobctl.engine.runtime.step import train_step
    from jobctl.engine.runtime.two_stage import TwoStageExecutor, share_ties, v_topology
    from jobctl.engine.schedule.zero_bubble import zb_v

    rank, P = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)  # as jobctl's workers (JOBCTL_THREADS=1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    spec = load_spec(job["spec"])
    t, mdef = spec.training, model_def(spec.model, spec.training.seed)
    topos = v_topology(P, rank, lambda d: d)
    stages = [Stage(mdef, job["stages"][topo.stage]) for topo in topos]
    share_ties(stages, mdef.ties)
    act = (t.micro_batch_size, spec.model.seq_len, spec.model.hidden)
    shard, data = Sharding(t.global_batch_size, 1, t.micro_batch_size), make_data(spec)
    ex = TwoStageExecutor(
        [
            StepExecutor(
                st,
                topo,
                data,
                shard,
                Channels(act if topo.stage else None, torch.float32, act, torch.float32),
                torch.device("cpu"),
            )
            for st, topo in zip(stages, topos, strict=True)
        ]
    )
    opt = build_optimizer([p for st in stages for p in st.parameters()], t)
    placed, times = zb_v(P, job["micro_batches"])[rank], []
    for step in range(job["steps"]):
        t0 = time.perf_counter()
        train_step(ex, placed, opt, t, step, rank)  # type: ignore[arg-type]
        times.append(time.perf_counter() - t0)
    if rank == 0:  # hosts the last stage
        Path(job["out"]).write_text(json.dumps(times))
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=2, help="P (ranks; 2P stages)")
    parser.add_argument("--micro-batches", type=int, default=8, help="M")
    parser.add_argument("--micro-batch", type=int, default=2, help="m")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--attempts", type=int, default=2, help="runs until one is undisturbed")
    parser.add_argument("--patience", type=float, default=60.0, help="seconds to wait for quiet")
    args = parser.parse_args(argv)
    jobbench.QUIET_PATIENCE_S = args.patience
    P, M, m, steps = args.stages, args.micro_batches, args.micro_batch, args.steps
    spec = _spec(P, M, m, steps)
    with tempfile.TemporaryDirectory(prefix="jobctl-zbv-") as tmp:
        home = Path(tmp)
        chunks = [
            st.blocks
            for st in make_plan(
                job_spec(**{**_overrides(spec), **layout(2 * P, 1, m, "1f1b")}), home=home
            ).stages
        ]
        results: dict[str, list[float]] = {"jobctl zb_v": [], **{f"torch {x}": [] for x in TORCH}}
        runs = {"jobctl zb_v": lambda: run_jobctl(dump_yaml(spec), chunks, M, steps, home / "j")}
        for name in TORCH:
            runs[f"torch {name}"] = lambda name=name: run_baseline(
                dump_yaml(spec), chunks, name, M, steps, home / "torch"
            )
        for _ in range(args.rounds):
            for label, run in runs.items():
                results[label].append(least_disturbed(run, args.attempts)[1])
    _report(results, P, M, m, chunks)


def _overrides(spec) -> dict:
    """The benchmark's spec overrides, for the 2P-stage plan that gives the partition."""
    return {
        **MODEL,
        "model.tie_embeddings": False,
        "training.global_batch_size": spec.training.global_batch_size,
        "hardware.nodes": 1,
        "hardware.processes_per_node": 2 * spec.hardware.processes_per_node,
    }


def _report(results: dict[str, list[float]], P: int, M: int, m: int, chunks) -> None:
    step = {k: statistics.median(v) for k, v in results.items()}
    print(f"P={P} ranks, 2P={2 * P} stages {chunks}, M={M}, m={m}, gloo:")
    for k, v in results.items():
        rounds = " ".join(f"{1e3 * x:.0f}" for x in v)
        print(f"  {k:<22} {1e3 * step[k]:6.1f} ms {M * m / step[k]:6.1f} samples/s [{rounds}]")
    best = min((v, k) for k, v in step.items() if k.startswith("torch"))
    print(
        f"jobctl zb_v vs torch zbv (same schedule): "
        f"{step['torch zbv'] / step['jobctl zb_v']:.2f}x; "
        f"vs torch's best here ({best[1]}): {best[0] / step['jobctl zb_v']:.2f}x"
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(json.loads(Path(sys.argv[2]).read_text()))
    else:
        main()
