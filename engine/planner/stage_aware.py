"""Stage-aware recomputation (Merak sec. 5.2): per-stage non-recompute ratios alpha_i.

Under 1F1B, stage i of s holds s - i micro-batches in flight, so with full
recomputation the first stages run short of memory last and the later ones waste
theirs. Merak lets a fraction alpha_i of each stage's modules keep their activations
(the rest recompute in backward), with the ratios set so that every stage would use
the same memory, (s - i) alpha_i M_a = (s - 1) alpha_1 M_a:

    alpha_i = min(1, (s - 1) alpha_1 / (s - i))  for i in [2, s - 1),
    alpha_{s-1} = alpha_{s-2},  alpha_s = 1,

and raises alpha_1 in steps until a stage runs out of memory. Here the modules are a
stage's blocks (``keep_i = floor(alpha_i n_i)`` leading blocks keep activations), the
memory is the planner's model (state, the schedule's in-flight micro-batches, the
recomputed blocks' input) and "out of memory" is that model exceeding
``hardware.memory_gb``, so the ratios are decided before anything runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

STEP = 0.05  # how finely alpha_1 is raised (Merak tunes it "at intervals")


def ratios(s: int, alpha1: float) -> list[float]:
    """Merak's alpha_1 .. alpha_s for ``s`` stages (index 0 is stage 1)."""
    if s == 1:
        return [1.0]
    out = [alpha1]
    for i in range(2, s + 1):
        if i == s:
            out.append(1.0)
        elif i == s - 1:
            out.append(out[s - 3])  # alpha_{s-1} = alpha_{s-2}
        else:
            out.append(min(1.0, (s - 1) * alpha1 / (s - i)))
    return out


def kept_blocks(alphas: list[float], stages: list[list[int]]) -> list[int]:
    """Leading blocks of each stage that keep their activations."""
    return [math.floor(a * len(b) + 1e-9) for a, b in zip(alphas, stages, strict=True)]


def tune(
    stages: list[list[int]],
    memory: Callable[[list[int]], list[float]],
    cap: float,
) -> tuple[float, list[float], list[int]] | None:
    """The largest alpha_1 (in steps of ``STEP``) whose stages all fit ``cap`` bytes:
    (alpha_1, alphas, kept blocks); None when even alpha_1 = 0 does not fit.

    ``memory(keep)`` gives each stage's bytes when it keeps ``keep[s]`` blocks.
    """
    best = None
    for k in range(round(1 / STEP) + 1):
        alpha1 = k * STEP
        alphas = ratios(len(stages), alpha1)
        keep = kept_blocks(alphas, stages)
        if max(memory(keep)) > cap:
            break
        best = (alpha1, alphas, keep)
    return best
