"""Stage-aware recomputation vs full recomputation at the same memory budget (Merak 5.2).

A 3-stage 1F1B pipeline of a 7-layer GPT (9 blocks) on this machine, with
``hardware.memory_gb`` half-way between what full recomputation needs and what
keeping every activation needs, so the planner must recompute:
``parallelism.recompute: all`` (every stage recomputes every micro-batch) against
``stage_aware`` (Merak's alpha_i: stage 0 raised until the memory model is full, the
last stage keeps everything). Both plans are run for real, interleaved, ``--rounds``
times each; the table gives the median step time after warm-up, samples/s, the
planner's prediction and the memory it planned per stage. Merak reports 1.02-1.21x
(GPT-2.5B on 8 RTX3090s).

    python -m benchmarks run stage_aware_recompute [--rounds 3] [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from benchmarks.lib.jobbench import job_spec, measure
from jobctl.engine.planner.resolver import make_plan

QUESTION = "Is stage-aware recomputation faster than full recomputation at the same memory budget?"
BASELINE = "parallelism.recompute: all on the same 3-stage pipeline, interleaved."

SHAPE = {
    "model.layers": 7,
    "model.hidden": 128,
    "model.seq_len": 64,
    "parallelism.pipeline_stages": 3,
    "parallelism.data_parallel": 1,
    "parallelism.schedule": "1f1b",
    "training.micro_batch_size": 2,
    "hardware.nodes": 1,
    "hardware.processes_per_node": 3,
}


def _plans(steps: int):
    base = {**SHAPE, "training.steps": steps}
    full = max(make_plan(job_spec(**base)).prediction.memory_per_stage_gb)
    rec = job_spec(**base, **{"parallelism.recompute": "all"})
    least = max(make_plan(rec).prediction.memory_per_stage_gb)
    cap = least + 0.5 * (full - least)  # full recomputation fits, keeping everything not
    out = {}
    for mode in ("all", "stage_aware"):
        spec = job_spec(**base, **{"parallelism.recompute": mode, "hardware.memory_gb": cap})
        out[mode] = (spec, make_plan(spec))
    return cap, out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args(argv)
    cap, plans = _plans(args.steps)
    times: dict[str, list[float]] = {mode: [] for mode in plans}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):  # interleaved, so drifts in machine speed hit both
            for mode, (spec, plan) in plans.items():
                times[mode].append(measure(spec, plan, Path(tmp) / f"{mode}-{r}").step_s)
    B = SHAPE["training.micro_batch_size"] * plans["all"][1].micro_batches
    print(f"memory cap {cap * 1024:.1f} MiB per process (half-way from full recomputation to none)")
    print(
        f"{'recompute':12}{'keep/blocks':>14}{'step s':>9}{'samples/s':>11}{'pred s':>9}"
        f"{'MiB/stage':>20}"
    )
    for mode, (_, plan) in plans.items():
        keep = " ".join(
            f"{s.keep_blocks}/{len(s.blocks)}"
            if s.keep_blocks is not None
            else "0/" + str(len(s.blocks))
            for s in plan.stages
        )
        step = statistics.median(times[mode])
        mem = " ".join(f"{x * 1024:.1f}" for x in plan.prediction.memory_per_stage_gb)
        print(
            f"{mode:12}{keep:>14}{step:>9.3f}{B / step:>11.1f}"
            f"{plan.prediction.step_time_s:>9.3f}{mem:>20}"
        )
    ratio = statistics.median(times["all"]) / statistics.median(times["stage_aware"])
    pred = plans["all"][1].prediction.step_time_s / plans["stage_aware"][1].prediction.step_time_s
    spread = [a / s for a, s in zip(times["all"], times["stage_aware"], strict=True)]
    print(
        f"stage-aware / full recomputation, samples/s: {ratio:.2f}x measured "
        f"(per round {', '.join(f'{x:.2f}' for x in spread)}), {pred:.2f}x predicted; "
        "Merak: 1.02-1.21x"
    )


if __name__ == "__main__":
    main()
