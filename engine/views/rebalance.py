"""``jobctl plan``'s rebalancing section: the predicted stage idle after each pruning
step, with the static stage map and after rebalancing (engine/rebalance/preview.py
computes it)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from jobctl.engine.rebalance.preview import RebalancePreview


def _idle(xs: list[float]) -> str:
    """The most idle stage's %, then every stage's."""
    return f"{100 * max(xs):.0f}: {' '.join(f'{100 * x:.0f}' for x in xs)}"


def print_rebalancing(console: Console, preview: RebalancePreview) -> None:
    """The predicted imbalance after each pruning step, and what rebalancing recovers."""
    cfg = preview.rebalancing
    how = f"{cfg.balancer} by {cfg.by}" if cfg.enabled else "if enabled: partition by time"
    table = Table(title=f"predicted stage idle after pruning (rebalancing: {how})")
    for col in ("step (sparsity)", "layers", "idle %", "rebalanced"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("step ms", justify="right")
    table.add_column("stages", no_wrap=True)
    if cfg.pack:
        table.add_column("pack", justify="right")
    for r in preview.rows:
        cells = [
            f"{r.step} ({100 * r.sparsity:.0f} %)",
            r.source,
            _idle(r.idle_static),
            _idle(r.idle_balanced),
            f"{1000 * r.step_static:.3g} -> {1000 * r.step_balanced:.3g}",
            " ".join(f"{s[0]}-{s[-1]}" if len(s) > 1 else str(s[0]) for s in r.stages),
        ]
        if cfg.pack:
            cells.append(str(r.pack) if r.pack else "-")
        table.add_row(*cells)
    console.print(table)
    console.print(
        "idle % = 1 - busy / step time of the simulated step: the most idle stage, then each "
        "stage, with the static stage map and after rebalancing (blocks per stage: stages). "
        "layers: 'profile' = each layer's sparsity as an earlier run of this job recorded "
        "it; 'uniform' = global pruning assumed to leave every prunable layer at the "
        f"schedule's sparsity. {_compute_note(preview.sparse_threshold)} Measured per-block "
        "times after each pruning step drive the real decision.",
        soft_wrap=False,  # prose: wraps at words at 80 columns and in a pipe (#47)
        highlight=False,
    )


def _compute_note(limit: float | str | None) -> str:
    """How pruned layers compute under ``pruning.sparse_threshold``."""
    if limit is None:
        return "Layers compute densely (sparse_threshold: null): pruning leaves their time."
    if limit == "auto":
        return (
            "A layer computes in CSR at or above the crossover measured for its shape on this "
            "device (none measured yet: dense), at the measured speed."
        )
    return f"Linear layers above {100 * limit:.0f} % sparsity run CSR."
