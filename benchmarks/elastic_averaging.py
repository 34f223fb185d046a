"""AvgPipe's elastic averaging vs the synchronous pipeline on the same devices and model.

A 2-stage advance-forward pipeline (P = 2, D = 1, 2 processes) of a 4-layer GPT at
the same global batch (B = 16 in micro-batches of 2): synchronous training against
``parallelism.averaging: elastic`` with N = 2 and N = 4 parallel pipelines, each run
for real, interleaved, ``--rounds`` times; the table gives the median step time after
warm-up and samples/s. jobctl runs the N pipelines of a rank one after another (each
on B / N of the batch), so the N pipelines fill no bubbles inside a batch: expect
no gain here (AvgPipe reports 1.7x on GPUs, where the parallel pipelines run
concurrently and the larger total batch per iteration cuts bubbles).

    python -m benchmarks.elastic_averaging [--rounds 3] [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from benchmarks.jobbench import job_spec, measure
from jobctl.engine.planner.resolver import make_plan

SHAPE = {
    "model.layers": 4,
    "model.hidden": 128,
    "model.seq_len": 64,
    "parallelism.pipeline_stages": 2,
    "parallelism.data_parallel": 1,
    "parallelism.schedule": "advance_forward",
    "training.global_batch_size": 16,
    "training.micro_batch_size": 2,
    "hardware.nodes": 1,
    "hardware.processes_per_node": 2,
}
MODES = {
    "sync": {},
    "elastic N=2": {"parallelism.averaging": "elastic", "parallelism.parallel_pipelines": 2},
    "elastic N=4": {"parallelism.averaging": "elastic", "parallelism.parallel_pipelines": 4},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    plans = {}
    for mode, extra in MODES.items():
        spec = job_spec(**SHAPE, **extra, **{"training.steps": args.steps})
        plans[mode] = (spec, make_plan(spec))
    times: dict[str, list[float]] = {mode: [] for mode in plans}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):  # interleaved, so drifts in machine speed hit all
            for k, (mode, (spec, plan)) in enumerate(plans.items()):
                times[mode].append(measure(spec, plan, Path(tmp) / f"{k}-{r}").step_s)
    B = SHAPE["training.global_batch_size"]
    sync = statistics.median(times["sync"])
    print(f"{'mode':14}{'step s':>9}{'samples/s':>11}{'vs sync':>9}  per round")
    for mode, ts in times.items():
        step = statistics.median(ts)
        rounds = ", ".join(f"{t:.3f}" for t in ts)
        print(f"{mode:14}{step:>9.3f}{B / step:>11.1f}{sync / step:>8.2f}x  {rounds}")


if __name__ == "__main__":
    main()
