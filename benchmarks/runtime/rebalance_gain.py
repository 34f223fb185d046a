"""Rebalancing and packing gain, measured in real runs (DynPipe Figs. 4.1-4.3, Table 4.1).

One invocation runs the same pruned 2-stage job through the local backend six times:
static (pruning, no rebalancing), one run per balancer (partition / diffusion, by time
/ by parameters) and one that packs onto 1 device after the first pruning step. The
model (``benchmarks.lib.rebalance_model``) is a GPT whose blocks differ in weight scale with
depth, so global magnitude pruning (Alg. 2) prunes the first stage's blocks hardest;
``pruning.sparse_threshold: auto`` runs a layer in CSR only where the crossover measured
on this machine says CSR is faster, so those blocks speed up and the stages drift
apart. Nothing else is uneven: dense, the planner's partition is balanced.

Schedule: eq. 3.1 with s_i = 52 %, s_f = 90 %, n = 2 intervals: exactly three pruning
steps, 52 %, 85.25 %, 90 %. Eq. 3.1 cannot give DynPipe's 52 %, 79 %, 90 % in three
steps: its last three values always satisfy (s_f - s_(n-2)) / (s_f - s_(n-1)) = 8, the
paper's give 3.5 (its 52 % and 79 % are the first two of four steps to 90 %: 52.0, 78.8,
88.6, 90.0). The realised sparsities are printed.

After each profiled step a balancer's decision is held for ``HOLD`` steps
(``rebalancing.hold_steps``): the same run trains the pruned model on the old layout,
then moves live and trains on the new one, so "before" and "after" come from one run,
minutes apart at most, under the same machine load. Per stage, idle % = 1 - busy / step
time (busy: the stage's forward+backward compute in the step, from the per-rank
heartbeats; step time: the reporter's wall time), median over the window. Throughput:
samples/s over the last steps at 90 %, against the static run; "in-run": median step
time before / after the move at the same sparsity. Overhead: a rebalancing's wall time
(decision: gather, balancer, broadcast; migration; every rank ready again) over the
run's mean step time, per pruning step. The machine is shared: each run reports the
CPU share other processes took meanwhile, and while ``--budget`` seconds allow, the
most disturbed runs are repeated and the less disturbed result kept.

That scenario is built to show the mechanism (weights scaled with depth, hidden 256
where CSR pays off on this CPU), and the output says so. ``--model builtin`` (also
part of ``both``, the default) runs the builtin GPT family at the same sizes with its
own pruning pattern, static and with the partition balancer by time, so the gain on
an unprepared model is printed beside it.

    python -m benchmarks run rebalance_gain [--model both|scenario|builtin] [--patience 15]
        [--quick]

``--quick`` runs two of each model's runs, static and the partition balancer by time,
at once (no wait for a quiet CPU) and once (no repeats): the same table, fewer rows.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from benchmarks.lib import jobbench
from benchmarks.lib.jobbench import Interference, job_spec, wait_quiet
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.pruning.crossover import resolve, shape_key
from tests.jobrun import events as events_of

QUESTION = "How much do rebalancing and packing gain on a pruned 2-stage job?"
BASELINE = "The same pruned job without rebalancing (static), and the builtin GPT family's runs."

LAYERS, HIDDEN, SEQ, MICRO, BATCH = 8, 256, 64, 4, 16
START, FREQ, END, TAIL, HOLD = 3, 8, 19, 9, 3  # prunes at 3, 11, 19
PRUNES = list(range(START, END + 1, FREQ))
BALANCERS = [
    ("partition", "time"),
    ("diffusion", "time"),
    ("partition", "params"),
    ("diffusion", "params"),
]


def _model(model: str) -> dict:
    """Overrides of the model: the built scenario, or the builtin GPT at its sizes."""
    args = {"layers": LAYERS, "hidden": HIDDEN, "heads": 4, "seq_len": SEQ, "vocab": 256}
    if model == "builtin":
        return {f"model.{k}": v for k, v in args.items()}
    return {
        "model.import": "benchmarks.lib.rebalance_model:factory",
        "model.import_args": args,
        "model.family": None,
        "model.seq_len": SEQ,
    }


def spec_for(kind: str, by: str = "time", model: str = "scenario"):
    """The job for one run: ``static``, a balancer name, or ``pack``."""
    over = {
        "name": f"rebalance-gain-{model}",
        **_model(model),
        "training.steps": END + TAIL,
        "training.optimizer": "sgd",  # small steps keep the depth-scaled magnitudes apart
        "training.lr": 1e-3,
        "training.global_batch_size": BATCH,
        "training.micro_batch_size": MICRO,
        "hardware.nodes": 1,
        "hardware.processes_per_node": 2,
        "parallelism.pipeline_stages": 2,
        "parallelism.data_parallel": 1,
        "pruning.enabled": True,
        "pruning.initial_sparsity": 0.52,
        "pruning.final_sparsity": 0.9,
        "pruning.start_step": START,
        "pruning.end_step": END,
        "pruning.frequency": FREQ,
        "rebalancing.enabled": kind != "static",
        "rebalancing.balancer": "partition" if kind in ("static", "pack") else kind,
        "rebalancing.by": by,
        "rebalancing.tolerance": 0.05,
        "rebalancing.hold_steps": HOLD,
        "rebalancing.pack": kind == "pack",
        "rebalancing.target_devices": 1 if kind == "pack" else None,
        "elasticity.heartbeat_timeout_s": 300.0,  # a shared machine: pruning may take a while
    }
    return job_spec(**over)


def crossovers() -> dict[str, float | None]:
    """The CSR crossover of each linear shape of the model (measured once, cached)."""
    torch.set_num_threads(1)  # as the workers run, and the record's key
    h, tokens = HIDDEN, MICRO * SEQ
    shapes = [(3 * h, h, tokens), (h, h, tokens), (4 * h, h, tokens), (h, 4 * h, tokens)]
    found = resolve(shapes, BATCH // MICRO)
    return {shape_key(s): found.get(shape_key(s)) for s in shapes}


@dataclass
class Run:
    name: str
    recs: list[dict]
    others: float  # CPU share other processes took during the run
    wall_s: float


def run_one(name: str, spec, home: Path) -> Run:
    from jobctl.engine.state.db import StateDB
    from jobctl.engine.supervise.service import ApplyOptions, launch

    wait_quiet()
    t0 = time.monotonic()
    with Interference() as other:
        run, outcome = launch(
            spec,
            make_plan(spec),
            StateDB(home),
            None,
            ApplyOptions(show_progress=False),
            Console(quiet=True),
        )
    if not outcome.ok:
        raise SystemExit(f"{name}: run failed: {outcome.message}")
    return Run(name, events_of(run.dir), other.fraction, time.monotonic() - t0)


def windows() -> list[tuple[range, range]]:
    """Per pruning step p: (the held steps on the old layout, the steps on the new one
    after its first); the profiled step p + 1 and the move's first step are left out."""
    ends = [*PRUNES[1:], END + TAIL]
    return [
        (range(p + 2, p + 2 + HOLD), range(p + 3 + HOLD, e + 1))
        for p, e in zip(PRUNES, ends, strict=True)
    ]


def step_times(run: Run, steps: range) -> dict[int, float]:
    return {
        r["step"]: r["step_time_s"] for r in run.recs if r["kind"] == "step" and r["step"] in steps
    }


def stage_idle(run: Run, steps: range) -> list[float]:
    """Per stage, the median of 1 - busy / step time over ``steps``."""
    wall = step_times(run, steps)
    busy: dict[tuple[int, int], float] = {}
    M = BATCH // MICRO  # heartbeats carry compute per micro-batch
    for r in run.recs:
        if r["kind"] == "heartbeat" and r["step"] in wall:
            key = (r["stage"], r["step"])
            busy[key] = max(busy.get(key, 0.0), r["compute_s"] * M)
    stages = sorted({s for s, _ in busy})
    return [
        statistics.median(1 - busy[(s, t)] / wall[t] for t in wall if (s, t) in busy)
        for s in stages
    ]


def median_step(run: Run, steps: range) -> float:
    return statistics.median(step_times(run, steps).values())


def overheads(run: Run, mean_step: float) -> list[tuple[float, bool]]:
    """Per pruning step: (rebalancing wall time in iterations, whether layers moved)."""
    out = []
    for r in run.recs:
        if r["kind"] in ("rebalanced", "packed"):
            out.append((r["seconds"] / mean_step, True))
        elif r["kind"] == "rebalance":
            out.append((r["decide_s"] / mean_step, False))
    return out


def _map(stages: list[list[int]]) -> str:
    return " | ".join(f"{s[0]}-{s[-1]}" if len(s) > 1 else str(s[0]) for s in stages)


def _idle(xs: list[float]) -> str:
    return f"{100 * max(xs):.0f} [{' '.join(f'{100 * x:.0f}' for x in xs)}]"


def row(run: Run, static: Run, devices: int) -> list[str]:
    """One run's cells: idle before -> after per level, throughput, cost, per device."""
    win = windows()
    moved = {r["step"] - 1 for r in run.recs if r["kind"] in ("rebalanced", "packed")}
    cells, gains = [], []
    for p, (before, after) in zip(PRUNES, win, strict=True):
        if run is static:
            cells.append(_idle(stage_idle(run, after)))
            continue
        cells.append(f"{100 * max(stage_idle(run, before)):.0f} -> {_idle(stage_idle(run, after))}")
        gain = median_step(run, before) / median_step(run, after)
        gains.append(f"{gain:.2f}" if p in moved else "-")
    mean = statistics.mean(v for w in win for v in step_times(run, w[1]).values())
    cost = " ".join(f"{x:.2f}{'*' if m else ''}" for x, m in overheads(run, mean))
    sps, base = BATCH / median_step(run, win[-1][1]), BATCH / median_step(static, win[-1][1])
    return [
        run.name,
        *cells,
        f"{sps:.1f}",
        f"{sps / base:.3f}",
        " ".join(gains) or "-",
        cost or "-",
        f"{sps / devices:.1f}",
        f"{sps / devices / (base / 2):.3f}",
        f"{100 * run.others:.0f} %",
    ]


def table(static: Run, runs: list[Run], packed: Run | None, title: str) -> Table:
    """DynPipe Fig. 4.2 (idle per sparsity level), Fig. 4.1 (throughput), Table 4.1
    (rebalancing cost), Fig. 4.3 (throughput per device after packing), in one table."""
    t = Table(title=f"rebalancing after global pruning, measured (2 stages, this machine): {title}")
    cols = ["run"] + [f"idle % at {s}" for s in ("52 %", "85 %", "90 %")]
    cols += [
        "samples/s",
        "vs static",
        "in-run",
        "cost (iters)",
        "per device",
        "vs static",
        "others' CPU",
    ]
    for c in cols:
        t.add_column(c, justify="left" if c == "run" else "right")
    for run in [static, *runs, *([packed] if packed else [])]:
        t.add_row(*row(run, static, 1 if run is packed else 2))
    return t


def describe(console: Console, static: Run, cross: dict) -> None:
    """Realised sparsity per pruning step and the crossovers used."""
    for r in static.recs:
        if r["kind"] == "pruning":
            stages = " ".join(f"{100 * s:.1f}" for s in r["stage_sparsity"])
            console.print(
                f"step {r['step']}: target {100 * r['target_sparsity']:.2f} %, realised "
                f"{100 * r['achieved_sparsity']:.2f} % ({r['pruned']} of {r['prunable']}); "
                f"per stage {stages} %",
                highlight=False,
            )
    shown = ", ".join(
        f"{k} {'none' if x is None else f'{100 * x:.0f} %'}" for k, x in cross.items()
    )
    console.print(f"CSR crossover per linear shape (out x in @ tokens): {shown}", highlight=False)


CONFIGS = [
    ("static", "static", "time"),
    *((f"{b} by {by}", b, by) for b, by in BALANCERS),
    ("packed to 1", "pack", "time"),
]
BUILTIN = [("static", "static", "time"), ("partition by time", "partition", "time")]
LEGEND = (
    "idle % = 1 - busy / step time per stage: 'before -> after' the move at that sparsity "
    "in the same run, after as most idle stage [each stage]; the static row never moves. "
    "in-run = step time before / after the move at the same sparsity (- = no move). "
    "cost = rebalancing wall time / mean step time per pruning step (* = layers moved; "
    "DynPipe Table 4.1: 4-25). per device = samples/s / devices in use at 90 %, vs the "
    "static run's on 2. Timings from a shared 2-core CPU: see others' CPU."
)
QUICK = {"static", "partition by time"}  # --quick's runs: the baseline and one balancer
SCENARIO_NOTE = (
    "scenario: built for this benchmark (benchmarks.lib.rebalance_model): a GPT whose weights "
    "scale with depth (x1.5 per block), hidden 256, where CSR pays off on this CPU; "
    "pruning skews its stages by design. The builtin GPT's own pattern is the 'builtin' table."
)
BUILTIN_NOTE = (
    "builtin: the builtin GPT family at the same sizes (no depth scaling), pruned by its "
    "own magnitudes: the gain on a model not prepared for this benchmark."
)


def measure_all(home: Path, budget_s: float, configs, model: str) -> dict[str, Run]:
    """Every config once; then, while the budget lasts, the most disturbed run again
    (keeping the less disturbed of the two)."""
    t0, done, retried = time.monotonic(), {}, set()
    for name, kind, by in configs:
        done[name] = run_one(name, spec_for(kind, by, model), home)
    while time.monotonic() - t0 < budget_s:
        worst = max(
            (r for r in done.values() if r.name not in retried),
            key=lambda r: r.others,
            default=None,
        )
        if worst is None or worst.others < 0.15:
            break
        retried.add(worst.name)
        kind, by = next((k, b) for n, k, b in configs if n == worst.name)
        again = run_one(worst.name, spec_for(kind, by, model), home)
        if again.others < worst.others:
            done[worst.name] = again
    return done


def report(console: Console, model: str, done: dict[str, Run], cross: dict) -> None:
    """The runs of one model: layouts, sparsities, the legend and the table."""
    static, packed = done["static"], done.get("packed to 1")
    runs = [r for n, r in done.items() if n not in ("static", "packed to 1")]
    first = _map([s.blocks for s in make_plan(spec_for("static", model=model)).stages])
    console.print(SCENARIO_NOTE if model == "scenario" else BUILTIN_NOTE, highlight=False)
    for run in done.values():
        moves = [
            f"after step {r['moved_at']}: {_map(r['stages_after'])}"
            for r in run.recs
            if r["kind"] in ("rebalanced", "packed")
        ]
        console.print(
            f"{run.name}: {run.wall_s:.0f} s; blocks {first} at first, "
            f"{', '.join(moves) or 'never moved'}",
            highlight=False,
        )
    describe(console, static, cross)
    console.print(table(static, runs, packed, model))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["both", "scenario", "builtin"], default="both")
    ap.add_argument(
        "--patience",
        type=float,
        default=15.0,
        help="seconds to wait for a quiet CPU before each run",
    )
    ap.add_argument(
        "--budget",
        type=float,
        default=240.0,
        help="seconds after which disturbed runs are no longer repeated",
    )
    ap.add_argument("--home", type=Path, default=None, help="keep the runs here (default: temp)")
    ap.add_argument("--quick", action="store_true", help="static and partition by time only")
    args = ap.parse_args(argv)
    if args.quick:
        args.patience = args.budget = 0.0
    jobbench.QUIET_PATIENCE_S = args.patience
    console = Console(width=180)
    cross = crossovers()
    models = ["scenario", "builtin"] if args.model == "both" else [args.model]
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            configs = CONFIGS if model == "scenario" else BUILTIN
            configs = [c for c in configs if not args.quick or c[0] in QUICK]
            got[model] = measure_all(args.home or Path(tmp), args.budget, configs, model)
    console.print(LEGEND, highlight=False, markup=False)
    for model in models:
        report(console, model, got[model], cross)


if __name__ == "__main__":
    main()
