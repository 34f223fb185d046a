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
from dataclasses import dataclass, replace

from jobctl.engine.calibration.record import Calibration
from jobctl.engine.planner.search import GB, Search, priced, simulate_candidate
from jobctl.engine.planner.stage_costs import Tables, activation_peaks
from jobctl.engine.planner.tp_overlap import tables_for
from jobctl.spec import JobSpec

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


@dataclass(frozen=True)
class StageAware:
    """The chosen ratios: alpha_1, every stage's alpha_i and kept blocks."""

    alpha1: float
    alphas: list[float]
    keep: list[int]


def apply(spec: JobSpec, cal: Calibration, found: Search) -> tuple[Search, StageAware | None]:
    """The winner of ``found`` with stage-aware recomputation in place of its full
    recomputation (``parallelism.recompute: stage_aware``), re-priced; unchanged where
    it does not recompute, or its schedule recomputes by design (Varuna, SCP). ZB-H1
    holds 1F1B's in-flight counts (its W deferred within them), so Merak's ratios
    serve it as they are."""
    win = found.ranked[0]
    lay = win.layout
    if spec.parallelism.recompute != "stage_aware" or not lay.recompute:
        return found, None
    if spec.parallelism.schedule == "zb_v":  # per V device, on the V variant
        return found, None  # (planner.v_shape.stage_aware)
    if lay.schedule not in ("1f1b", "gpipe", "zb_h1"):
        return found, None
    bare = replace(lay, recompute=False)
    peaks = activation_peaks(bare, None)
    cap = spec.hardware.memory_gb * GB

    def memory(keep: list[int]) -> list[float]:
        return _memory(cal, win.stages, peaks, lay.m, keep)

    tuned = tune(win.stages, memory, cap)
    if tuned is None:
        return found, None
    alpha1, alphas, keep = tuned
    cand = _priced(spec, cal, win, bare, keep)
    cand.memory = memory(keep)
    note = (
        f"stage-aware recomputation (Merak 5.2): alpha_1 = {alpha1:.2f}, per stage "
        + ", ".join(f"{a:.2f}" for a in alphas)
        + f"; {cand.step:.4g} s/step vs {win.step:.4g} s/step with full recomputation"
    )
    ranked = [cand, *found.ranked[1:]]
    chosen = StageAware(alpha1, alphas, keep)
    return replace(found, ranked=ranked, explanation=[*found.explanation, note]), chosen


def _priced(spec: JobSpec, cal: Calibration, win, bare, keep: list[int]):
    """The winner without R actions, its recomputed blocks' forwards in the backward;
    those blocks run plain TMP (``tp_stage``), so at T > 1 their forward, backward
    and recompute are priced without sub-pipelining's saving (``tp_overlap``)."""
    tables = Tables(cal)
    times, plain = tables.times(bare.m), tables_for(tables, plain=True).times(bare.m)
    costs = priced(tables, win)
    rest = [blocks[k:] for blocks, k in zip(win.stages, keep, strict=True)]
    lost_f = [sum(plain.fwd[i] - times.fwd[i] for i in r) for r in rest]
    more_b = [sum(plain.fwd[i] + plain.bwd[i] - times.bwd[i] for i in r) for r in rest]
    graph = [x + e for x, e in zip(costs.graph, lost_f, strict=True)]
    b = [x + e for x, e in zip(costs.b, more_b, strict=True)]  # the recompute, in backward
    costs = replace(costs, graph=graph, b=b)
    cand = replace(win, layout=bare, costs=costs, sim=None, actions=[])
    simulate_candidate(spec, tables, cand)
    return cand


def _memory(
    cal: Calibration, stages: list[list[int]], peaks: list, m: int, keep: list[int]
) -> list[float]:
    """Bytes per stage keeping ``keep[s]`` blocks' activations per in-flight micro-batch
    and, for the rest, only the input of the first recomputed block."""
    out = []
    for blocks, k, peak in zip(stages, keep, peaks, strict=True):
        state = sum(cal.blocks[i].state_bytes for i in blocks)
        acts = sum(cal.blocks[i].act_bytes for i in blocks[:k]) * m
        rest = blocks[k:]
        inp = cal.blocks[rest[0] - 1].boundary_bytes * m if rest and rest[0] > 0 else 0.0
        work = max(cal.blocks[i].peak_bytes.get(m, 0.0) - cal.blocks[i].state_bytes for i in blocks)
        out.append(state + peak.full * (acts + inp) + max(work, 0.0))
    return out
