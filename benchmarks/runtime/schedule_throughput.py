"""Schedule throughput in real runs, and jobctl's runtime against PyTorch's pipelining.

Same model, same partition, same micro-batching (P stages, D=1, M micro-batches of
m): jobctl's runtime with GPipe, 1F1B, zero-bubble ZB-H1 and ZB-V (two stages per
rank in V shape, as a real job; each also with recompute), Varuna and Merak's shifted
critical path, and ``torch.distributed.pipelining``'s
ScheduleGPipe, Schedule1F1B and ZB-H1 (ScheduleInterleavedZeroBubble, one stage per
rank) on the same blocks, and its two-stages-per-rank schedules (Interleaved1F1B,
InterleavedZeroBubble, ZBVZeroBubble) on the partition of the same blocks into 2P
stages that jobctl's ZB-V plan runs (``torch_pipeline_worker``). Every configuration
runs ``--rounds`` times in interleaved order (so drifting load on the shared machine
hits all of them alike; odd rounds run PyTorch's side first), each time as the least
disturbed of up to ``--attempts`` runs started when the CPU was quiet (one rule for
both runtimes); a configuration's figure is the median over rounds of its median step
time after warm-up. The ratios are the robust form: per round, PyTorch's step over
jobctl's (same schedule; and best over best, each side's fastest in that round), then
the median and the spread (min-max) over rounds. jobctl's CPU stages
on one machine pass activations through shared memory, PyTorch's through gloo TCP: the
schedules both runtimes have also run in jobctl with ``JOBCTL_P2P=gloo`` ("jobctl gloo
..."), so the gain of the schedule and runtime (gloo against gloo) and the gain of the
transport (shared memory against gloo, in jobctl) are printed apart (a ZB-V rank has
a shared-memory link per stage boundary, ``runtime.two_stage``). Tied embeddings
are off: PyTorch's schedules do not sum a tied weight's gradient across stages.

    python -m benchmarks run schedule_throughput [--stages 2] [--micro-batches 8] [--rounds 2]
        [--jobctl zb_v,zb_h1,1f1b] [--torch zbv,interleaved_zb,interleaved_1f1b,1f1b]

The machine has 2 cores shared with other work: absolute times are noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.lib import jobbench
from benchmarks.lib.benchlib import least_disturbed
from benchmarks.lib.jobbench import job_spec, layout, measure_best
from benchmarks.lib.torch_pipeline_worker import MULTI, run_baseline
from jobctl.engine.core.env import P2P
from jobctl.engine.planner.resolver import make_plan
from jobctl.spec import dump_yaml

QUESTION = (
    "How fast are jobctl's pipeline schedules in real runs, against PyTorch's pipelining "
    "on the same model and partition?"
)
BASELINE = (
    "torch.distributed.pipelining's schedules on the same blocks; jobctl on gloo for the "
    "transport's share."
)

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
    ("zb_v", "zb_v", "none"),
    ("zb_v+R", "zb_v", "all"),
]
# torch.distributed.pipelining schedules (torch_pipeline_worker.SCHEDULES); the ones in
# its MULTI with a placement host two stages per rank, on a partition into 2P stages.
TORCH = ["gpipe", "1f1b", "zb_h1", "interleaved_1f1b", "interleaved_zb", "zbv"]
SAME = {"gpipe": "gpipe", "1f1b": "1f1b", "zb_h1": "zb_h1", "zb_v": "zbv"}  # jobctl: torch
GLOO = ["gpipe", "1f1b", "zb_h1", "zb_v"]  # also run on gloo in jobctl


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


def one_round(args, home: Path, results: dict[str, list[float]], torch_first: bool) -> None:
    """Run every configuration once; append each median step time to ``results``."""
    sides = [_jobctl_side, _torch_side]
    for side in reversed(sides) if torch_first else sides:
        side(args, home, results)


def _jobctl_side(args, home: Path, results: dict[str, list[float]]) -> None:
    P, M, m, steps = args.stages, args.micro_batches, args.micro_batch, args.steps
    for label, schedule, recompute in JOBCTL:
        if label not in args.jobctl:
            continue
        spec = _spec(P, M, m, steps, schedule, recompute)
        plan = make_plan(spec, home=home)
        run = measure_best(spec, plan, home, attempts=args.attempts)
        _record(results, f"jobctl {label}", run.step_s, run.interference)
        if label in GLOO:
            run = _jobctl_gloo(spec, plan, home, args.attempts)
            _record(results, f"jobctl gloo {label}", run.step_s, run.interference)


def _torch_side(args, home: Path, results: dict[str, list[float]]) -> None:
    P, M, m, steps = args.stages, args.micro_batches, args.micro_batch, args.steps
    spec = _spec(P, M, m, steps, "1f1b", "none")
    stages = [st.blocks for st in make_plan(spec, home=home).stages]
    # Two stages per rank: the partition into 2P stages jobctl's ZB-V plan runs.
    v_plan = make_plan(_spec(P, M, m, steps, "zb_v", "none"), home=home)
    chunks = [st.blocks for st in v_plan.stages]
    for schedule in TORCH:
        if schedule not in args.torch:
            continue
        blocks = chunks if MULTI.get(schedule) else stages

        def run(blocks=blocks, schedule=schedule) -> list[float]:
            return run_baseline(dump_yaml(spec), blocks, schedule, M, steps, home / "torch")

        other, step = least_disturbed(run, args.attempts)
        _record(results, f"torch {schedule}", step, other)


def _record(results: dict[str, list[float]], label: str, step: float, other: float) -> None:
    """Keep one run's median step and the other processes' CPU share; say it now (a
    long benchmark cut short still leaves its runs on stderr)."""
    results[label].append(step)
    results["other load"].append(other)
    print(f"  {label}: {1e3 * step:.1f} ms/step, other load {100 * other:.0f} %", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
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
    parser.add_argument("--jobctl", type=_names, default=[x[0] for x in JOBCTL], help="labels")
    parser.add_argument("--torch", type=_names, default=TORCH, help="PyTorch's schedules")
    args = parser.parse_args(argv)
    jobbench.QUIET_PATIENCE_S = args.patience
    labels = [f"jobctl {x}" for x in args.jobctl]
    labels += [f"jobctl gloo {x}" for x in GLOO if x in args.jobctl]
    labels += [f"torch {x}" for x in args.torch]
    results: dict[str, list[float]] = {k: [] for k in [*labels, "other load"]}
    with tempfile.TemporaryDirectory(prefix="jobctl-sched-") as tmp:
        for r in range(args.rounds):
            one_round(args, Path(tmp), results, torch_first=r % 2 == 1)
    step = {k: statistics.median(results[k]) for k in labels}
    B = args.micro_batches * args.micro_batch
    print(f"P={args.stages} D=1 M={args.micro_batches} m={args.micro_batch}, same partition:")
    for k in labels:
        rounds = " ".join(f"{1e3 * x:.1f}" for x in results[k])
        print(f"  {k:<24} {1e3 * step[k]:6.1f} ms/step {B / step[k]:6.1f} samples/s [{rounds}]")
    load = 100 * statistics.median(results["other load"])
    print(f"  other processes' share of the CPU during the runs: median {load:.0f} %")
    _ratios(step, results)


def _names(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def _spread(ratios: list[float]) -> str:
    """Median and min-max over rounds of per-round throughput ratios."""
    return f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"


def _per_round(results: dict[str, list[float]], ours: str, theirs: str) -> list[float]:
    """Per round, ``theirs``' step over ``ours``' (> 1: ``ours`` is faster)."""
    return [t / o for o, t in zip(results[ours], results[theirs], strict=True)]


def _ratios(step: dict[str, float], results: dict[str, list[float]]) -> None:
    def speed(a: str, b: str) -> str:
        return _spread(_per_round(results, a, b)) if a in step and b in step else "-"

    print(
        "schedules (throughput ratio, median [min-max] over rounds): "
        + ", ".join(
            f"{a}/{b} {speed(f'jobctl {a}', f'jobctl {b}')}"
            for a, b in [
                ("varuna", "gpipe"),
                ("varuna", "1f1b"),
                ("varuna", "gpipe+R"),
                ("shifted_critical_path", "1f1b"),
                ("zb_h1", "1f1b"),
                ("zb_v", "1f1b"),
                ("zb_v", "zb_h1"),
            ]
        )
    )
    gloo = ", ".join(f"{x} {speed(f'jobctl gloo {x}', f'torch {SAME[x]}')}" for x in GLOO)
    shm = ", ".join(f"{x} {speed(f'jobctl {x}', f'jobctl gloo {x}')}" for x in GLOO)
    print(f"schedule + runtime, both on gloo (jobctl gloo vs torch): {gloo}")
    print(f"transport, in jobctl (shared memory vs gloo): {shm}")
    same = ", ".join(f"{x} {speed(f'jobctl {x}', f'torch {y}')}" for x, y in SAME.items())
    print(f"jobctl vs torch, same schedule (target >= 1.0x): {same}")
    ours = [k for k in step if k.startswith("jobctl")]
    theirs = [k for k in step if k.startswith("torch")]
    if not ours or not theirs:
        return
    best = [
        min(results[k][r] for k in theirs) / min(results[k][r] for k in ours)
        for r in range(len(results[ours[0]]))
    ]
    print(
        f"jobctl's best vs torch's best, per round: {_spread(best)} (target >= 1.15x; "
        f"by median: {min(ours, key=step.get)} vs {min(theirs, key=step.get)})"
    )


if __name__ == "__main__":
    main()
