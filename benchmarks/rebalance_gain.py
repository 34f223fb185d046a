"""Rebalancing gain measured in one real run (DynPipe Fig. 4.2 / Table 4.1, on this CPU).

A 3-stage GPT prunes to 90 % in DynPipe's steps (52 %, 79 %, 89 %, 90 %); blocks above
``--sparse-threshold`` compute in CSR, so pruning changes block times unevenly. After
each profiled step the balancer decides a move, and ``rebalancing.hold_steps`` keeps
the old layout a few more steps: the same run then trains the pruned model unbalanced
and, after the live move, rebalanced. Per rebalancing event the script reports the
measured stage compute imbalance (max/mean - 1, from the per-rank heartbeats) and the
median step time before and after, and the migration's cost in training iterations.
Last line: step time rebalanced / not rebalanced after the final pruning step.

    python -m benchmarks.rebalance_gain [--balancer partition|diffusion] [--by time|params]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from jobctl.engine.planner import make_plan
from tests.jobrun import events as events_of

from .jobbench import Interference, job_spec, wait_quiet

START, FREQ, PRUNINGS, HOLD, AFTER = 2, 6, 4, 3, 5


def spec_for(balancer: str, by: str, threshold: float, hidden: int):
    end = START + FREQ * PRUNINGS
    return job_spec(
        **{
            "model.layers": 6,
            "model.hidden": hidden,
            "model.seq_len": 64,
            "training.steps": end + 1 + HOLD + AFTER,
            "training.optimizer": "sgd",
            "training.micro_batch_size": 4,
            "hardware.nodes": 1,
            "hardware.processes_per_node": 3,
            "parallelism.pipeline_stages": 3,
            "parallelism.data_parallel": 1,
            "pruning.enabled": True,
            "pruning.start_step": START,
            "pruning.end_step": end,
            "pruning.frequency": FREQ,
            "pruning.sparse_threshold": threshold,
            "rebalancing.enabled": True,
            "rebalancing.balancer": balancer,
            "rebalancing.by": by,
            "rebalancing.tolerance": 0.0,
            "rebalancing.hold_steps": HOLD,
            # the machine is shared: a pruning step (global top-k) may take a while
            "elasticity.heartbeat_timeout_s": 300.0,
        }
    )


def _imbalance(xs: list[float]) -> float:
    mean = sum(xs) / len(xs)
    return max(xs) / mean - 1 if mean else 0.0


def stage_compute(recs: list[dict], steps: range) -> list[float]:
    """Median per-micro-batch compute per stage over ``steps`` (max over replicas)."""
    per: dict[int, list[float]] = {}
    for r in recs:
        if r["kind"] == "heartbeat" and r["step"] in steps:
            per.setdefault(r["stage"], []).append(r["compute_s"])
    return [statistics.median(per[s]) for s in sorted(per)]


def step_median(recs: list[dict], steps: range) -> float:
    return statistics.median(
        r["step_time_s"] for r in recs if r["kind"] == "step" and r["step"] in steps
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--balancer", default="partition", choices=["partition", "diffusion"])
    ap.add_argument("--by", default="time", choices=["time", "params"])
    ap.add_argument("--sparse-threshold", type=float, default=0.5)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--home", type=Path, default=None, help="keep the run here (default: temp)")
    args = ap.parse_args()
    console = Console(width=160)
    spec = spec_for(args.balancer, args.by, args.sparse_threshold, args.hidden)
    plan = make_plan(spec)
    from jobctl.engine.apply import ApplyOptions, launch
    from jobctl.engine.state import StateDB

    wait_quiet()
    with tempfile.TemporaryDirectory() as tmp, Interference() as other:
        home = args.home or tmp
        run, outcome = launch(
            spec,
            plan,
            StateDB(Path(home)),
            None,
            ApplyOptions(show_progress=False),
            Console(quiet=True),
        )
        if not outcome.ok:
            raise SystemExit(f"run failed: {outcome.message}")
        recs = events_of(run.dir)
    moves = [r for r in recs if r["kind"] in ("rebalanced", "packed")]
    kept = [r for r in recs if r["kind"] == "rebalance"]
    table = Table(title=f"{args.balancer} by {args.by}: measured in one run (hold {HOLD} steps)")
    for col in ("profiled", "sparsity", "moved", "stages", "imbal. before", "after",
                "step s before", "after", "ratio", "move (iters)"):  # fmt: skip
        table.add_column(col, justify="right")
    sparsity = {r["step"] + 1: r["achieved_sparsity"] for r in recs if r["kind"] == "pruning"}
    ratio = None
    for r in moves:
        at = r["moved_at"]
        held = range(r["step"] + 1, at + 1)  # pruned, old layout, no profiling hooks
        nxt = min([m["step"] for m in moves + kept if m["step"] > at], default=10**9)
        after = range(at + 1, min(at + 1 + AFTER, nxt))
        before_s, after_s = step_median(recs, held), step_median(recs, after)
        ratio = after_s / before_s
        table.add_row(
            str(r["step"]),
            f"{100 * sparsity.get(r['step'], 0):.0f} %",
            ", ".join(f"{b}:{s}->{d}" for b, s, d in r["moves"]),
            " | ".join(f"{s[0]}-{s[-1]}" for s in r["stages_after"]),
            f"{100 * _imbalance(stage_compute(recs, held)):.0f} %",
            f"{100 * _imbalance(stage_compute(recs, after)):.0f} %",
            f"{before_s:.4f}",
            f"{after_s:.4f}",
            f"{ratio:.3f}",
            f"{r['seconds'] / before_s:.2f}",
        )
    console.print(table)
    for r in kept:
        console.print(f"step {r['step']}: no move ({r['reason']})", highlight=False)
    console.print(f"other processes took {100 * other.fraction:.0f} % of the CPU meanwhile")
    if ratio is None:
        raise SystemExit("no rebalancing move happened: nothing to compare")
    print(f"step time rebalanced / not rebalanced (last move, same run): {ratio:.3f}")


if __name__ == "__main__":
    main()
