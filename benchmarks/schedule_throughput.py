"""Schedule throughput in real runs, and jobctl's runtime against PyTorch's pipelining.

Same model, same partition, same micro-batching (P stages, D=1, M micro-batches of
m): jobctl's runtime with GPipe, 1F1B, zero-bubble ZB-H1 (each also with recompute),
Varuna and Merak's shifted critical path, and ``torch.distributed.pipelining``'s
ScheduleGPipe, Schedule1F1B and ZB-H1 (ScheduleInterleavedZeroBubble, one stage per
rank) on the same blocks, and its two-stages-per-rank schedules (Interleaved1F1B,
InterleavedZeroBubble, ZBVZeroBubble) on jobctl's partition of the same blocks into 2P
stages (``torch_pipeline_worker``). Every configuration runs
``--rounds`` times in interleaved order (so drifting load on the shared machine hits
all of them alike), each time as the least disturbed of up to ``--attempts`` runs
started when the CPU was quiet (one rule for both runtimes); a configuration's figure
is the median over rounds of its median step time after warm-up. jobctl's CPU stages
on one machine pass activations through shared memory, PyTorch's through gloo TCP: the
schedules both runtimes have also run in jobctl with ``JOBCTL_P2P=gloo`` ("jobctl gloo
..."), so the gain of the schedule and runtime (gloo against gloo) and the gain of the
transport (shared memory against gloo, in jobctl) are printed apart. Tied embeddings
are off: PyTorch's schedules do not sum a tied weight's gradient across stages.

    python benchmarks/schedule_throughput.py [--stages 2] [--micro-batches 8] [--rounds 2]

The machine has 2 cores shared with other work: absolute times are noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from benchmarks import jobbench
from benchmarks.jobbench import (
    WARMUP_STEPS,
    Interference,
    job_spec,
    layout,
    measure_best,
    wait_quiet,
)
from benchmarks.torch_pipeline_worker import MULTI, run_baseline
from jobctl.engine.core.env import P2P
from jobctl.engine.planner.resolver import make_plan
from jobctl.spec import dump_yaml

MODEL = {"model.hidden": 96, "model.layers": 4, "model.seq_len": 48, "model.heads": 4}
JOBCTL = [  # (label, schedule, recompute)
    ("gpipe", "gpipe", "none"),
    ("1f1b", "1f1b", "none"),
    ("gpipe+R", "gpipe", "all"),
    ("1f1b+R", "1f1b", "all"),
    ("varuna", "varuna", "none"),
    ("shifted_critical_path", "shifted_critical_path", "none"),
    ("zb_h1", "zb_h1", "none"),
    ("zb_h1+R", "zb_h1", "all"),
]
# torch.distributed.pipelining schedules (torch_pipeline_worker.SCHEDULES); the ones in
# its MULTI with a placement host two stages per rank, on a partition into 2P stages.
TORCH = ["gpipe", "1f1b", "zb_h1", "interleaved_1f1b", "interleaved_zb", "zbv"]
SAME = ["gpipe", "1f1b", "zb_h1"]  # the same schedule in both runtimes


def _spec(P: int, M: int, m: int, steps: int, schedule: str, recompute: str):
    return job_spec(
        **MODEL,
        **{
            "model.tie_embeddings": False,
            "training.steps": steps,
            "training.global_batch_size": M * m,
            "hardware.nodes": 1,
            "hardware.processes_per_node": P,
        },
        **layout(P, 1, m, schedule, **{"parallelism.recompute": recompute}),
    )


def _jobctl_gloo(spec, plan, home: Path, attempts: int):
    """``measure_best`` with the workers on gloo for their point-to-point messages."""
    saved = os.environ.get(P2P)
    os.environ[P2P] = "gloo"
    try:
        return measure_best(spec, plan, home, attempts=attempts)
    finally:
        if saved is None:
            os.environ.pop(P2P)
        else:
            os.environ[P2P] = saved


def one_round(args, home: Path, results: dict[str, list[float]]) -> None:
    """Run every configuration once; append each median step time to ``results``."""
    P, M, m, steps = args.stages, args.micro_batches, args.micro_batch, args.steps
    for label, schedule, recompute in JOBCTL:
        spec = _spec(P, M, m, steps, schedule, recompute)
        plan = make_plan(spec, home=home)
        run = measure_best(spec, plan, home, attempts=args.attempts)
        results[f"jobctl {label}"].append(run.step_s)
        results["other load"].append(run.interference)
        stages = [st.blocks for st in plan.stages]
        if label in SAME:
            run = _jobctl_gloo(spec, plan, home, args.attempts)
            results[f"jobctl gloo {label}"].append(run.step_s)
            results["other load"].append(run.interference)
    # Two stages per rank: jobctl's own partition of the blocks into 2P stages.
    chunks = [
        st.blocks for st in make_plan(_spec(2 * P, M, m, steps, "1f1b", "none"), home=home).stages
    ]
    for schedule in TORCH:
        spec = _spec(P, M, m, steps, "1f1b", "none")
        blocks = chunks if MULTI.get(schedule) else stages
        best = None  # (interference, step): the least disturbed, as measure_best keeps
        for _ in range(args.attempts):
            wait_quiet()
            with Interference() as other:
                times = run_baseline(dump_yaml(spec), blocks, schedule, M, steps, home / "torch")
            run = (other.fraction, statistics.median(times[WARMUP_STEPS:]))
            best = run if best is None or run[0] < best[0] else best
            if best[0] < 0.05:
                break
        results["other load"].append(best[0])
        results[f"torch {schedule}"].append(best[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=2, help="P")
    parser.add_argument("--micro-batches", type=int, default=8, help="M")
    parser.add_argument("--micro-batch", type=int, default=2, help="m")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--attempts", type=int, default=2, help="runs until one is undisturbed")
    parser.add_argument(
        "--patience", type=float, default=180.0, help="seconds to wait for a quiet CPU per run"
    )
    args = parser.parse_args()
    jobbench.QUIET_PATIENCE_S = args.patience
    labels = [f"jobctl {x[0]}" for x in JOBCTL] + [f"jobctl gloo {x}" for x in SAME]
    labels += [f"torch {x}" for x in TORCH]
    results: dict[str, list[float]] = {k: [] for k in [*labels, "other load"]}
    with tempfile.TemporaryDirectory(prefix="jobctl-sched-") as tmp:
        for _ in range(args.rounds):
            one_round(args, Path(tmp), results)
    step = {k: statistics.median(results[k]) for k in labels}
    B = args.micro_batches * args.micro_batch
    print(f"P={args.stages} D=1 M={args.micro_batches} m={args.micro_batch}, same partition:")
    for k in labels:
        rounds = " ".join(f"{1e3 * x:.1f}" for x in results[k])
        print(f"  {k:<30} {1e3 * step[k]:7.1f} ms/step {B / step[k]:7.1f} samples/s  [{rounds}]")
    load = 100 * statistics.median(results["other load"])
    print(f"  other processes' share of the CPU during the runs: median {load:.0f} %")
    _ratios(step)


def _ratios(step: dict[str, float]) -> None:
    def speed(a: str, b: str) -> str:
        return f"{step[b] / step[a]:.2f}x"

    print(
        "schedules (throughput ratio): "
        f"varuna/gpipe {speed('jobctl varuna', 'jobctl gpipe')}, "
        f"varuna/1f1b {speed('jobctl varuna', 'jobctl 1f1b')}, "
        f"varuna/gpipe+R {speed('jobctl varuna', 'jobctl gpipe+R')}, "
        f"scp/gpipe {speed('jobctl shifted_critical_path', 'jobctl gpipe')}, "
        f"scp/1f1b {speed('jobctl shifted_critical_path', 'jobctl 1f1b')}, "
        f"scp/1f1b+R {speed('jobctl shifted_critical_path', 'jobctl 1f1b+R')}, "
        f"zb_h1/1f1b {speed('jobctl zb_h1', 'jobctl 1f1b')}"
    )
    gloo = ", ".join(f"{x} {speed(f'jobctl gloo {x}', f'torch {x}')}" for x in SAME)
    shm = ", ".join(f"{x} {speed(f'jobctl {x}', f'jobctl gloo {x}')}" for x in SAME)
    print(f"schedule + runtime, both on gloo (jobctl gloo vs torch): {gloo}")
    print(f"transport, in jobctl (shared memory vs gloo): {shm}")
    ours = min((v, k) for k, v in step.items() if k.startswith("jobctl"))
    theirs = min((v, k) for k, v in step.items() if k.startswith("torch"))
    same = ", ".join(f"{x} {speed(f'jobctl {x}', f'torch {x}')}" for x in SAME)
    print(
        f"jobctl vs torch.distributed.pipelining (throughput ratio): {same}, "
        f"best {theirs[0] / ours[0]:.2f}x ({ours[1]} vs {theirs[1]}; target >= 1.15x)"
    )


if __name__ == "__main__":
    main()
