"""``jobctl plan``'s pruning section: the sparsity at every pruning step (eq. 3.1),
counted by engine/pruning/preview.py."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from jobctl.engine.pruning.preview import PruningPreview
from jobctl.spec import PruningSpec

PROFILED = (
    " The step after each pruning step profiles every block's forward+backward time and "
    "stage memory."
)


def _bar(fraction: float, width: int = 12) -> str:
    full = round(fraction * width)
    return "█" * full + "·" * (width - full)


def print_pruning(console: Console, preview: PruningPreview, explain: bool = False) -> None:
    """A table of the pruning steps (the step after each is profiled per block); with
    ``explain``, the equation and its parameters."""
    p, prunable, total = preview.pruning, preview.prunable, preview.total
    table = Table(title="pruning schedule (eq. 3.1, global magnitude)")
    for col in ("step", "sparsity", "pruned", "kept", "of the rest"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)
    for s in preview.steps:
        table.add_row(
            str(s.step),
            f"{100 * s.sparsity:.1f} %",
            f"{s.pruned:,}",
            f"{s.kept:,}",
            f"{100 * s.share:.0f} %",
            _bar(s.sparsity),
        )
    console.print(table)
    console.print(
        f"prunable: {prunable:,} of {total:,} parameters ({', '.join(p.prunable)}); at the "
        f"end {100 * preview.pruned_at_end / max(1, total):.1f} % of the whole model is zero."
        + PROFILED,
        soft_wrap=False,  # prose: wraps at words at 80 columns and in a pipe (#47)
        highlight=False,
        markup=False,
    )
    if explain:
        _print_explanation(console, p)


def _print_explanation(console: Console, p: PruningSpec) -> None:
    """Eq. 3.1 with the spec's parameters, and when pruned layers compute in CSR."""
    n = (p.end_step - p.start_step) // p.frequency
    console.print(
        f"  s_t = s_f + (s_i - s_f)(1 - (t - t0)/(n dt))^3 with s_i={p.initial_sparsity}, "
        f"s_f={p.final_sparsity}, t0={p.start_step}, dt={p.frequency}, n={n} "
        "(DynPipe eq. 3.1): prune fast while many weights are irrelevant, slower later. "
        "The threshold is global: each stage offers its k smallest |w|, the k-th smallest "
        "of all offers is cut (Alg. 2), so stages end up unevenly sparse.",
        highlight=False,
        markup=False,
    )
    if p.sparse_threshold == "auto":
        console.print(
            "  a pruned linear layer computes in CSR once its sparsity reaches the CSR/dense "
            "crossover measured on this device for its shape (python -m benchmarks run "
            "sparse_crossover prints it); below that it stays dense",
            highlight=False,
        )
    elif p.sparse_threshold is not None:
        console.print(
            f"  linear layers above {100 * p.sparse_threshold:.0f} % sparsity compute in CSR "
            "(python -m benchmarks run sparse_crossover measures whether that pays off here)",
            highlight=False,
        )
