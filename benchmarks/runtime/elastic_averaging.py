"""AvgPipe's elastic averaging vs the synchronous pipeline on the same devices and model.

A 2-stage advance-forward pipeline (P = 2, D = 1, 2 processes) of a 4-layer GPT at
global batch B = 16 in the planner's micro-batch size (m = 2 here): synchronous
training against ``parallelism.averaging: elastic`` with N = 2 and N = 4 parallel
pipelines, each run for real, interleaved, ``--rounds`` times. The table gives the
median and the best step time after warm-up, samples/s and the ratios of the best
round (other processes on a shared CPU only add time), the planner's predicted step
(``pred s``) and bubble ratio of the step's action list and ``other``, the median share of the CPU
other processes took during the runs (``jobbench.Interference``).

jobctl deals B over the N models (each trains on B / N), and a rank runs the N
pipelines interleaved in the plan's one action list over B / m micro-batches: the
step has the bubble of a synchronous step at B, (P-1)/(NM+P-1) with M = B / (N m)
per pipeline, not the N fill/drains of the pipelines one after another (the rows
``sync B/N`` show what one pipeline alone costs: what each of the N sequential runs
cost before). AvgPipe's 1.7x compares against synchronous training at the batch each
parallel model sees (B / N here): that ratio is the ``vs B/N`` column.

    python -m benchmarks run elastic_averaging [--rounds 3] [--steps 20] [--pipelines 2,4]

``--pipelines 2`` runs N = 2 alone (and synchronous at B and B / 2): 3 runs a round
instead of 5.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from benchmarks.lib.jobbench import job_spec, measure
from jobctl.engine.planner.resolver import make_plan

QUESTION = (
    "How much throughput does AvgPipe's elastic averaging gain over the synchronous pipeline?"
)
BASELINE = "Synchronous training at B and at B / N on the same devices and model."

SHAPE = {
    "model.layers": 4,
    "model.hidden": 128,
    "model.seq_len": 64,
    "parallelism.pipeline_stages": 2,
    "parallelism.data_parallel": 1,
    "parallelism.schedule": "advance_forward",
    "hardware.nodes": 1,
    "hardware.processes_per_node": 2,
}
B = 16


def modes(m: int, pipelines: list[int]) -> dict[str, dict]:
    """Synchronous at B and at B / N, elastic with each N of ``pipelines`` at B, all in
    ``m``."""
    out: dict[str, dict] = {}
    for n in (1, *pipelines):
        name = "sync B" if n == 1 else f"sync B/{n}"
        out[name] = {"training.global_batch_size": B // n, "training.micro_batch_size": m}
    for n in pipelines:
        out[f"elastic N={n}"] = {
            "training.global_batch_size": B,
            "training.micro_batch_size": m,
            "parallelism.averaging": "elastic",
            "parallelism.parallel_pipelines": n,
        }
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--pipelines", default="2,4", help="the N to run, comma-separated")
    args = ap.parse_args(argv)
    pipelines = [int(n) for n in args.pipelines.split(",")]
    auto = job_spec(**SHAPE, **{"training.global_batch_size": B})
    m = make_plan(auto).micro_batch_size  # the planner's micro-batch size at B
    plans = {}
    for mode, extra in modes(m, pipelines).items():
        spec = job_spec(**SHAPE, **extra, **{"training.steps": args.steps})
        plans[mode] = (spec, make_plan(spec))
    times: dict[str, list[float]] = {mode: [] for mode in plans}
    other: dict[str, list[float]] = {mode: [] for mode in plans}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):  # interleaved, so drifts in machine speed hit all
            for k, (mode, (spec, plan)) in enumerate(plans.items()):
                run = measure(spec, plan, Path(tmp) / f"{k}-{r}")
                times[mode].append(run.step_s)
                other[mode].append(run.interference)
    report(plans, times, other, m)


def report(plans: dict, times: dict, other: dict, m: int) -> None:
    """The table: ratios on the best round (other work on the shared CPU only adds
    time), the median beside it, and each round's step time below."""
    print(f"P=2 D=1 advance_forward B={B} m={m}; ratios on the best round's samples/s")
    print(
        f"{'mode':12}{'B':>3}{'median s':>9}{'best s':>7}{'pred s':>7}{'smp/s':>7}"
        f"{'vs B':>7}{'vs B/N':>7}{'bubble':>7}{'other':>6}"
    )
    best = {mode: min(ts) for mode, ts in times.items()}
    rate = {mode: plans[mode][0].training.global_batch_size / t for mode, t in best.items()}
    for mode, ts in times.items():
        spec, plan = plans[mode]
        n, pred = spec.parallelism.parallel_pipelines, plan.prediction
        alone = rate["sync B" if n == 1 else f"sync B/{n}"]
        per_model = f"{rate[mode] / alone:.2f}x" if mode.startswith("elastic") else "-"
        print(
            f"{mode:12}{spec.training.global_batch_size:>3}{statistics.median(ts):>9.3f}"
            f"{best[mode]:>7.3f}{pred.step_time_s:>7.3f}{rate[mode]:>7.1f}"
            f"{rate[mode] / rate['sync B']:>6.2f}x{per_model:>7}"
            f"{pred.bubble_ratio:>7.3f}{statistics.median(other[mode]):>6.2f}"
        )
    for mode, ts in times.items():
        print(f"  {mode:12}" + ", ".join(f"{t:.3f}" for t in ts))


if __name__ == "__main__":
    main()
