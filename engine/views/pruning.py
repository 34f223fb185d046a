"""``jobctl plan``'s pruning section: the sparsity at every pruning step (eq. 3.1).

Counts come from the model's parameter shapes, built on the meta device (no memory, no
compute), so a laptop can show the schedule of a model it could never hold.
"""

from __future__ import annotations

import torch
from rich.console import Console
from rich.table import Table

from jobctl.engine.model.blocks import model_def
from jobctl.engine.pruning.pruner import prunable_names
from jobctl.engine.pruning.schedule import schedule
from jobctl.engine.pruning.selection import count_to_prune


def prunable_counts(spec) -> tuple[int, int]:
    """(prunable elements, all parameter elements) of the spec's model."""
    mdef = model_def(spec.model, spec.training.seed)
    shapes: dict[str, int] = {}
    with torch.device("meta"):
        for i in range(mdef.num_blocks):
            for n, p in mdef.block(i).named_parameters():
                shapes[f"layers.{i}.{n}"] = p.numel()
    names = prunable_names(list(shapes), spec.pruning.prunable, mdef.ties)
    aliases = {t.alias for t in mdef.ties}
    total = sum(v for n, v in shapes.items() if n not in aliases)
    return sum(shapes[n] for n in names), total


def _bar(fraction: float, width: int = 12) -> str:
    full = round(fraction * width)
    return "█" * full + "·" * (width - full)


def print_pruning(console: Console, spec, explain: bool = False) -> None:
    """A table of the pruning steps; with ``explain``, the equation and its parameters."""
    p = spec.pruning
    prunable, total = prunable_counts(spec)
    table = Table(title="pruning schedule (eq. 3.1, global magnitude)")
    for col in ("step", "sparsity", "pruned", "kept", "of the rest"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)
    before = 0
    for t, s in schedule(spec):
        k = count_to_prune(s, prunable)
        share = (k - before) / max(1, prunable - before)
        table.add_row(
            str(t),
            f"{100 * s:.1f} %",
            f"{k:,}",
            f"{prunable - k:,}",
            f"{100 * share:.0f} %",
            _bar(s),
        )
        before = k
    console.print(table)
    end = count_to_prune(p.final_sparsity, prunable)
    console.print(
        f"prunable: {prunable:,} of {total:,} parameters ({', '.join(p.prunable)}); at the "
        f"end {100 * end / max(1, total):.1f} % of the whole model is zero. The step after "
        "each pruning step profiles every block's forward+backward time and stage memory.",
        soft_wrap=True,
        highlight=False,
    )
    if explain:
        n = (p.end_step - p.start_step) // p.frequency
        console.print(
            f"  s_t = s_f + (s_i - s_f)(1 - (t - t0)/(n dt))^3 with s_i={p.initial_sparsity}, "
            f"s_f={p.final_sparsity}, t0={p.start_step}, dt={p.frequency}, n={n} "
            "(DynPipe eq. 3.1): prune fast while many weights are irrelevant, slower later. "
            "The threshold is global: each stage offers its k smallest |w|, the k-th smallest "
            "of all offers is cut (Alg. 2), so stages end up unevenly sparse.",
            soft_wrap=True,
            highlight=False,
            markup=False,
        )
        if p.sparse_threshold == "auto":
            console.print(
                "  a pruned linear layer computes in CSR once its sparsity reaches the CSR/dense "
                "crossover measured on this device for its shape (benchmarks/sparse_crossover.py "
                "prints it); below that it stays dense",
                soft_wrap=True,
                highlight=False,
            )
        elif p.sparse_threshold is not None:
            console.print(
                f"  linear layers above {100 * p.sparse_threshold:.0f} % sparsity compute in CSR "
                "(benchmarks/sparse_crossover.py measures whether that pays off here)",
                soft_wrap=True,
                highlight=False,
            )
