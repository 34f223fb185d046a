"""AvgPipe's (M, N) tuning quality (sec. 5.2, Fig. 19): the tuner's pick against
real runs of several (M, N) settings.

The job: a 4-layer GPT (hidden 128, seq 64) on a 2-stage advance-forward pipeline
(P = 2, D = 1, 2 processes), global batch B = 16, ``parallelism.averaging:
elastic`` with ``parallel_pipelines: auto`` and ``micro_batches: auto``. The tuner
profiles its one setting (the smallest N with the largest M) for 20 batches and
predicts all 14 settings (N M divides 16, N <= 8); then ``--settings`` of them (the
pick and others spread over the predicted order) each run for real through the
local backend (``jobbench.measure``: the median step after warm-up), ``--rounds``
times, the settings alternating within each round, so drifts in the shared host's
speed fall on all of them. Printed: each setting's predicted step and rank, its
measured samples/s (best round and median over rounds) and rank, and the ratio of
the pick's measured samples/s to the best measured (the issue's target: >= 0.95).

    python -m benchmarks run elastic_tuning [--rounds 2] [--steps 16] [--settings 7]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.lib.jobbench import job_spec, measure
from jobctl.engine.averaging.tuning import concrete, resolve
from jobctl.engine.planner.resolver import make_plan

QUESTION = "Does AvgPipe's (M, N) tuner pick the fastest setting?"
BASELINE = (
    "Real runs of the pick and of other settings spread over the predicted order, interleaved."
)

SHAPE = {
    "model.layers": 4,
    "model.hidden": 128,
    "model.seq_len": 64,
    "parallelism.pipeline_stages": 2,
    "parallelism.data_parallel": 1,
    "parallelism.schedule": "advance_forward",
    "parallelism.averaging": "elastic",
    "parallelism.parallel_pipelines": "auto",
    "parallelism.micro_batches": "auto",
    "hardware.nodes": 1,
    "hardware.processes_per_node": 2,
    "training.global_batch_size": 16,
    "training.micro_batch_size": "auto",
}


def chosen(rows: list, pick, k: int) -> list:
    """The pick and ``k - 1`` others spread evenly over the predicted order."""
    order = sorted(rows, key=lambda r: r.step_s)
    others = [r for r in order if r is not pick]
    step = max(1, len(others) // max(1, k - 1))
    return [pick] + others[::step][: k - 1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--settings", type=int, default=7)
    args = ap.parse_args(argv)
    spec = job_spec(**SHAPE, **{"training.steps": args.steps})
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        _, tuning = resolve(spec, Path(tmp) / "tune")
        tuned_s = time.perf_counter() - t0
        rows = chosen(list(tuning.rows), tuning.pick, args.settings)
        runs = {(r.M, r.N): concrete(spec, r.M, r.N) for r in rows}
        plans = {key: make_plan(s) for key, s in runs.items()}
        rates: dict = {key: [] for key in runs}
        for rnd in range(args.rounds):  # interleaved: each round runs every setting
            for i, key in enumerate(runs):
                rates[key].append(16 / _step_s(runs[key], plans[key], Path(tmp) / f"{i}-{rnd}"))
    report(tuning, rows, rates, tuned_s)


def _step_s(spec, plan, home: Path) -> float:
    """A real run's median step; one retry when its launch fails (a port taken on
    the shared host), so one bad start does not lose the other runs."""
    try:
        return measure(spec, plan, home).step_s
    except RuntimeError as e:
        print(f"retrying M/N run after: {str(e).splitlines()[0]}")
        return measure(spec, plan, home.with_name(home.name + "-retry")).step_s


def report(tuning, rows: list, rates: dict, tuned_s: float) -> None:
    """The table, then the pick's ratio to the best measured setting."""
    p = tuning.profile
    print(f"P=2 D=1 advance_forward B=16; profiled M={p.m} N={p.n}, tuning {tuned_s:.0f} s")
    print(
        f"{'M':>3}{'N':>3}{'m':>4}{'pred ms':>9}{'pred#':>6}{'best smp/s':>11}"
        f"{'median':>8}{'meas#':>6}  rounds"
    )
    pred_rank = {id(r): i + 1 for i, r in enumerate(sorted(rows, key=lambda r: r.step_s))}
    best = {key: max(v) for key, v in rates.items()}
    meas_rank = {key: i + 1 for i, key in enumerate(sorted(best, key=best.get, reverse=True))}
    for r in sorted(rows, key=lambda r: r.step_s):
        key = (r.M, r.N)
        mark = " <- pick" if r is tuning.pick else ""
        print(
            f"{r.M:>3}{r.N:>3}{r.size:>4}{1e3 * r.step_s:>9.1f}{pred_rank[id(r)]:>6}"
            f"{best[key]:>11.1f}{statistics.median(rates[key]):>8.1f}{meas_rank[key]:>6}"
            f"  {' '.join(f'{x:.0f}' for x in rates[key])}{mark}"
        )
    pick = (tuning.pick.M, tuning.pick.N)
    top = max(best.values())
    med = {key: statistics.median(v) for key, v in rates.items()}
    print(
        f"pick/best measured samples/s: {best[pick] / top:.3f} (best rounds), "
        f"{med[pick] / max(med.values()):.3f} (medians); target >= 0.95"
    )
    rounds = range(len(rates[pick]))
    per_round = [rates[pick][i] / max(v[i] for v in rates.values()) for i in rounds]
    print(f"pick/best within each round: {' '.join(f'{x:.3f}' for x in per_round)}")


if __name__ == "__main__":
    main()
