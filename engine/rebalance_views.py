"""Predicted stage load after pruning, and what rebalancing would recover (``jobctl plan``).

Per pruning step of the schedule, each block's calibrated forward+backward time is
rescaled for its density. Global magnitude pruning's per-block spread is unknown before
training, so every prunable weight is taken to keep ``1 - s`` of its elements. A block
computing densely (masked weights) takes as long as before; one above
``pruning.sparse_threshold`` computes in CSR, whose cost is taken proportional to the
nonzeros and equal to dense at the threshold (the measured crossover), so its prunable
share scales by ``(1 - s) / (1 - threshold)``. The balancer of ``rebalancing`` then runs
on those costs (or on nonzero parameter counts, ``by: params``) and the simulator
predicts the step with the static and the rebalanced stage map.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

from .calibration_cache import calibration_for
from .model import model_def
from .plan import Plan
from .planner_costs import BlockTimes
from .pruning import prunable_names
from .pruning_schedule import schedule
from .rebalance import imbalance, loads_of, rebalance
from .rebalance_plan import choose_pack, layout_of, memory_cap, memory_model, simulate_stages


def block_shares(spec) -> tuple[list[int], list[int]]:
    """Per block: (all parameter elements, prunable elements), from meta-device shapes."""
    mdef = model_def(spec.model, spec.training.seed)
    sizes: dict[str, int] = {}
    with torch.device("meta"):
        for i in range(mdef.num_blocks):
            for n, p in mdef.block(i).named_parameters():
                sizes[f"layers.{i}.{n}"] = p.numel()
    names = set(prunable_names(list(sizes), spec.pruning.prunable, mdef.ties))
    names |= {t.alias for t in mdef.ties if t.canonical in names}  # the head computes too
    total, prunable = [0] * mdef.num_blocks, [0] * mdef.num_blocks
    for n, v in sizes.items():
        b = int(n.split(".")[1])
        total[b] += v
        prunable[b] += v if n in names else 0
    return total, prunable


def pruned_costs(spec, times: list[float], sparsity: float) -> tuple[list[float], list[float]]:
    """(predicted seconds, nonzero parameters) per block at ``sparsity``."""
    total, prunable = block_shares(spec)
    limit = spec.pruning.sparse_threshold
    k = 1.0 if limit is None or sparsity <= limit else (1 - sparsity) / (1 - limit)
    secs, nnz = [], []
    for t, n, p in zip(times, total, prunable, strict=True):
        share = p / n if n else 0.0
        secs.append(t * (1 - share + share * k))
        nnz.append(n - p * sparsity)
    return secs, nnz


@dataclass
class Row:
    step: int
    sparsity: float
    static: list[float]
    balanced: list[float]
    stages: list[list[int]]
    step_static: float
    step_balanced: float
    pack: int | None


def predict(spec, plan: Plan, home=None) -> list[Row]:
    """One row per pruning step: stage seconds static vs rebalanced, predicted steps."""
    cal = calibration_for(spec, home)
    times = BlockTimes.at(cal, plan.micro_batch_size)
    base = [f + b for f, b in zip(times.fwd, times.bwd, strict=True)]
    lay, cfg = layout_of(plan), spec.rebalancing
    stages = [list(s.blocks) for s in plan.stages]
    mem, cap = memory_model(spec, cal, lay), memory_cap(spec)
    rows = []
    for step, s in schedule(spec):
        if s <= 0.0:  # nothing pruned at this step (see pruning_schedule.target_at)
            continue
        secs, nnz = pruned_costs(spec, base, s)
        costs = secs if cfg.by == "time" else nnz
        d = rebalance(costs, stages, cfg.balancer, cfg.by, cfg.tolerance, mem, cap)
        pack = None
        if cfg.pack:
            got = choose_pack(spec, cal, plan, secs, d.stages, cfg.tolerance, cfg.target_devices)
            pack = got.P if got is not None else None
        rows.append(
            Row(
                step,
                s,
                loads_of(secs, stages),
                loads_of(secs, d.stages),
                d.stages,
                simulate_stages(spec, cal, lay, stages, secs).step_time,
                simulate_stages(spec, cal, lay, d.stages, secs).step_time,
                pack,
            )
        )
        stages = d.stages
    return rows


def _ms(xs: list[float]) -> str:
    return " ".join(f"{1000 * x:.1f}" for x in xs)


def print_rebalancing(console: Console, spec, plan: Plan, home=None) -> None:
    """The predicted imbalance after each pruning step, and what rebalancing recovers."""
    cfg = spec.rebalancing
    how = f"{cfg.balancer} by {cfg.by}" if cfg.enabled else "if enabled: partition by time"
    if not cfg.enabled:
        cfg = cfg.model_copy(update={"balancer": "partition", "by": "time"})
        spec = spec.model_copy(update={"rebalancing": cfg})
    table = Table(title=f"predicted stage load after pruning (rebalancing: {how})")
    for col in ("step (sparsity)", "stage ms", "imbal.", "rebalanced ms", "imbal.", "step s"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("stages", no_wrap=True)
    if cfg.pack:
        table.add_column("pack", justify="right")
    for r in predict(spec, plan, home):
        cells = [
            f"{r.step} ({100 * r.sparsity:.0f} %)",
            _ms(r.static),
            f"{100 * imbalance(r.static):.0f} %",
            _ms(r.balanced),
            f"{100 * imbalance(r.balanced):.0f} %",
            f"{r.step_static:.3g} -> {r.step_balanced:.3g}",
            " | ".join(f"{s[0]}-{s[-1]}" for s in r.stages),
        ]
        if cfg.pack:
            cells.append(str(r.pack) if r.pack else "-")
        table.add_row(*cells)
    console.print(table)
    dense = spec.pruning.sparse_threshold is None
    console.print(
        "imbal. = slowest stage / mean - 1. "
        + (
            "Blocks compute densely (no pruning.sparse_threshold), so pruning leaves their "
            "time unchanged; "
            if dense
            else f"Blocks above {100 * spec.pruning.sparse_threshold:.0f} % sparsity run CSR; "
        )
        + "measured per-block times after each pruning step drive the real decision.",
        soft_wrap=True,
        highlight=False,
    )
