"""The gradual pruning schedule (Zhu and Gupta 2017; DynPipe eq. 3.1).

    s_t = s_f + (s_i - s_f) (1 - (t - t0) / (n dt))^3    for t in {t0, t0 + dt, ..., t0 + n dt}

with s_i / s_f the initial / final sparsity, t0 the first pruning step, dt the pruning
frequency and n the number of pruning intervals (t0 + n dt = end step). A step ``t``
counts optimizer steps taken: pruning at ``t`` happens after the optimizer step that
completes step ``t`` (``t = 0``: before training). Pure functions, no torch.
"""

from __future__ import annotations

from jobctl.spec.phases import PruningSpec


def cubic_sparsity(t: int, initial: float, final: float, start: int, end: int) -> float:
    """Eq. 3.1 at step ``t``: ``initial`` before/at ``start``, ``final`` at/after ``end``."""
    if end <= start:
        raise ValueError(f"pruning end step {end} must be after start step {start}")
    progress = min(1.0, max(0.0, (t - start) / (end - start)))
    return final + (initial - final) * (1.0 - progress) ** 3


def pruning_steps(start: int, end: int, frequency: int) -> list[int]:
    """The steps at which the schedule prunes: start, start + dt, ..., end."""
    if frequency < 1:
        raise ValueError(f"pruning frequency must be >= 1, got {frequency}")
    steps = list(range(start, end + 1, frequency))
    if steps[-1] != end:
        steps.append(end)  # the final sparsity is always reached at end_step
    return steps


def schedule(p: PruningSpec) -> list[tuple[int, float]]:
    """(step, target sparsity) of every pruning event of a spec's ``pruning`` section."""
    return [
        (t, cubic_sparsity(t, p.initial_sparsity, p.final_sparsity, p.start_step, p.end_step))
        for t in pruning_steps(p.start_step, p.end_step, p.frequency)
    ]


def target_at(pruning: PruningSpec, step: int) -> float | None:
    """Target sparsity if ``step`` is a pruning step with something to prune, else None."""
    for t, s in schedule(pruning):
        if t == step:
            return s if s > 0.0 else None
    return None


def sparsity_in_effect(pruning: PruningSpec, step: int) -> float:
    """Sparsity the model has after ``step`` steps (the last pruning step <= step)."""
    done = [s for t, s in schedule(pruning) if t <= step]
    return done[-1] if done else 0.0
