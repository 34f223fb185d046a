"""Any data-parallel degree: which D to try, and how many micro-batches each runs.

The global batch is N = B / m whole micro-batches; replica d of D takes N // D of them,
one more for d < N % D (``data.Sharding``), so any D trains as one process does (each
micro-batch's loss weighted by its samples, gradients summed). The step runs the
busiest replica's M = ceil(N / D) (``micro_batches``).
"""

from __future__ import annotations

from jobctl.engine.planner.stage_costs import Tables
from jobctl.spec import JobSpec, TrainingSpec


def data_parallel_layouts(spec: JobSpec, P: int, G: int, m: int) -> list[tuple[int, int, str]]:
    """(D, m, note) to try for P: every D from 1 to floor(G/P) (an explicit D only).

    Any D trains: replicas take whole micro-batches, N // D or one more (N = B / m,
    ``Sharding``), so the step runs the busiest replica's ceil(N / D). Only m must
    divide the global batch; an m that does not is lowered to the nearest divisor.
    """
    B, par = spec.training.global_batch_size, spec.parallelism
    note = ""
    if B % m:
        m2 = max(d for d in range(1, m) if B % d == 0)
        note, m = f"m lowered to {m2} to divide the global batch {B}", m2
    if isinstance(par.data_parallel, int):
        return [(par.data_parallel, m, note)]
    top = max(1, min(G // P, B // m))
    return [(D, m, note) for D in range(top, 0, -1)]


def micro_batches(B: int, D: int, m: int) -> int:
    """M: micro-batches of the busiest replica, ceil((B / m) / D)."""
    return -(-(B // m) // D)


def fill_variant(training: TrainingSpec, P: int, D: int, m: int) -> int | None:
    """A smaller m giving at least P micro-batches, when m leaves the pipeline unfilled."""
    B = training.global_batch_size
    if isinstance(training.micro_batch_size, int) or micro_batches(B, D, m) >= P:
        return None
    smaller = [d for d in range(1, m) if B % d == 0 and micro_batches(B, D, d) >= P]
    return max(smaller) if smaller else None


def compute_floor(spec: JobSpec, tables: Tables, P: int, D: int, m: int) -> float:
    """No schedule runs M micro-batches in less than M x the bottleneck stage's forward
    + backward (the min-max partition without recompute: the least any stage can do)."""
    costs, last = tables.times(m).balance_costs("none")
    stages = tables.stages(P, m, "none")
    worst = max(sum((last if s is stages[-1] else costs)[i] for i in s) for s in stages)
    return micro_batches(spec.training.global_batch_size, D, m) * worst
