"""ZB-V in the planner: a searched layout's V variant, priced and turned into a plan.

The search ranks one-stage-per-device layouts; ZB-V (two stages per device, the zero-
bubble paper's sec. 6) is the V variant of one of them: the same P devices, D, m and
M, with the model cut into 2P stages (``Tables.stages``, then the cuts moved to
balance devices, not stages: ``v_partition``) and device d hosting stages d and
2P-1-d (``schedule.placement.v_placement``). ``consider``
takes the chosen layout (``objective.choose``): under ``parallelism.schedule: zb_v``
(searched as ``zb_h1``: the same B/W split and, per device, the same peak of P whole
stages' activations) it becomes the V variant; under ``auto`` the V variant wins when
its simulated step is shorter and it fits memory (never where CPU workers share one
host's cores: its step is priced without ``contention``'s core sharing);
otherwise the search's answer stands as it was. The step
is ``simulator.devices``' (sends between the two stages of one device are free),
without send jitter or the core-sharing model of ``contention``; a device's memory
is its two stages' each at its own peak (an upper bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from itertools import accumulate, product

from jobctl.engine.calibration.record import Calibration
from jobctl.engine.core.plan import StagePlan
from jobctl.engine.planner.search import Candidate, PlanError, Search
from jobctl.engine.planner.simulator.devices import simulate_devices
from jobctl.engine.planner.sizing import GB
from jobctl.engine.planner.stage_costs import Tables, recompute_counts, stage_costs, stage_memory
from jobctl.engine.schedule.checks import peak_activations
from jobctl.engine.schedule.placement import Placed, device_text, stage_lists, v_placement
from jobctl.engine.schedule.zero_bubble import zb_v
from jobctl.spec import JobSpec
from jobctl.spec.two_stage import two_stage_violations

__all__ = [
    "VCandidate",
    "consider",
    "stage_aware",
    "v_candidate",
    "v_partition",
    "v_stage_plans",
]


@dataclass
class VCandidate(Candidate):
    """A V layout: ``stages`` and ``actions`` hold the 2P stages, ``memory`` the P
    devices, ``sim`` is a ``simulator.devices.DeviceSimResult``."""

    placed: list[list[Placed]] = field(default_factory=list)
    keep: list[int] | None = None  # stage-aware: each stage's leading blocks kept
    alphas: list[float] | None = None  # and its device's ratio alpha


def v_candidate(spec: JobSpec, cal: Calibration, base: Candidate) -> VCandidate:
    """The V variant of ``base`` (same P, D, m, M and recompute), simulated."""
    lay, tables = base.layout, Tables(cal)
    P, S = lay.P, 2 * lay.P
    mode = "all" if lay.recompute else "none"
    block_costs = tables.times(lay.m).balance_costs(mode)[0]
    stages = v_partition(block_costs, P, tables.stages(S, lay.m, mode))
    stage_lay = replace(lay, P=S, schedule="zb_v")  # the cost tables' view: S stages
    costs = stage_costs(cal, stage_lay, stages, replace(base.hosting, P=S), tables.times(lay.m))
    placed = zb_v(P, lay.M, recompute=lay.recompute)
    actions = stage_lists(placed, S)
    model = replace(costs.model(stage_lay, recompute_counts(actions)), jitter=0.0)
    per_stage = stage_memory(cal, stages, [peak_activations(a) for a in actions], lay.m)
    memory = [per_stage[a] + per_stage[b] for a, b in v_placement(P)]
    cand = VCandidate(
        replace(lay, schedule="zb_v"),
        stages,
        base.hosting,
        costs,
        base.note,
        memory=memory,
        actions=actions,
        sim=simulate_devices(placed, model),  # type: ignore[arg-type]
        placed=placed,
    )
    worst = max(range(P), key=lambda d: memory[d])
    if memory[worst] > spec.hardware.memory_gb * GB:
        cand.why_not = (
            f"does not fit memory: device {worst} (stages {worst}, {S - 1 - worst}) needs "
            f"{memory[worst] / GB:.2f} GB > {spec.hardware.memory_gb} GB"
        )
    return cand


def v_partition(costs: list[float], P: int, start: list[list[int]]) -> list[list[int]]:
    """2P contiguous stages balanced per device (stage d with stage 2P-1-d), from the
    per-stage min-max partition ``start``: move one cut by one block at a time while
    (heaviest device, sum of squared device loads) decreases. A local search: pairing
    the first stage with the last makes the exact split no longer a contiguous one."""
    ends = [0, *accumulate(len(st) for st in start)]
    prefix = [0.0, *accumulate(costs)]

    def score(e: list[int]) -> tuple[float, float]:
        per = [prefix[e[k + 1]] - prefix[e[k]] for k in range(2 * P)]
        dev = [per[d] + per[2 * P - 1 - d] for d in range(P)]
        return max(dev), sum(x * x for x in dev)

    best, improved = score(ends), True
    while improved:
        improved = False
        for k, step in product(range(1, 2 * P), (-1, 1)):
            moved = [*ends[:k], ends[k] + step, *ends[k + 1 :]]
            if moved[k - 1] < moved[k] < moved[k + 1] and score(moved) < best:
                ends, best, improved = moved, score(moved), True
    return [list(range(ends[k], ends[k + 1])) for k in range(2 * P)]


def consider(spec: JobSpec, cal: Calibration, found: Search) -> Search:
    """``found`` with the chosen layout's V variant: the winner under ``zb_v`` (or an
    error saying why it cannot be), under ``auto`` where faster (module doc)."""
    win, par = found.ranked[0], spec.parallelism
    explicit = par.schedule == "zb_v"
    blocks, S = cal.num_blocks, 2 * win.layout.P
    if explicit and blocks < S:
        raise PlanError(f"zb_v needs 2P = {S} stages; the model has {blocks} blocks")
    # auto: never where CPU workers share one host's cores (module doc)
    usable = win.layout.P > 1 and blocks >= S and not win.hosting.share_cores
    if not explicit and (par.schedule != "auto" or not usable or _refused(spec)):
        return found
    v = v_candidate(spec, cal, win)
    if explicit and v.why_not:
        raise PlanError(f"zb_v at {win.layout.label()}: {v.why_not}")
    # auto: the V variant replaces the winner where faster; else the search's answer
    # stays as it was, its alternatives too
    if not explicit and (v.why_not or v.step >= win.step):
        return found
    line = f"zb_v: the V variant of {win.layout.label()}, {v.step:.4g} s/step "
    line += f"vs {win.step:.4g} s/step (simulator.devices, no jitter or core sharing)"
    ranked = [v, win, *found.ranked[1:]]
    return Search(ranked, found.rejected, [*found.explanation, line], found.pruned)


def _refused(spec: JobSpec) -> bool:
    """Would ``schedule: zb_v`` be refused with this spec (``spec.two_stage``)?"""
    as_v = spec.model_copy(
        update={"parallelism": spec.parallelism.model_copy(update={"schedule": "zb_v"})}
    )
    return any(True for _ in two_stage_violations(as_v))


def stage_aware(spec: JobSpec, cal: Calibration, found: Search) -> Search:
    """Merak 5.2 on a V winner that recomputes (``parallelism.recompute: stage_aware``):
    per device, the largest ratio alpha (in steps of ``stage_aware.STEP``) whose two
    stages, each keeping its ``floor(alpha n)`` leading blocks' activations, fit
    ``hardware.memory_gb``; the rest of each stage recomputes in its backward (no R
    actions), re-priced. Merak's closed-form ratios are 1F1B's in-flight counts; a V
    device's two stages hold other counts, which its own memory model sets here."""
    v = found.ranked[0]
    if spec.parallelism.recompute != "stage_aware" or not isinstance(v, VCandidate):
        return found
    if not v.layout.recompute:
        return found
    P, S, lay = v.layout.P, 2 * v.layout.P, replace(v.layout, recompute=False)
    placed = zb_v(P, lay.M, recompute=False)
    actions = stage_lists(placed, S)
    peaks = [peak_activations(a) for a in actions]
    tuned = _device_ratios(cal, v.stages, peaks, lay.m, spec.hardware.memory_gb * GB, P)
    if tuned is None:  # even alpha = 0 does not fit: full recompute stays
        return found
    keep, alphas, memory = tuned
    times = Tables(cal).times(lay.m)
    more = [sum(times.fwd[i] for i in st[k:]) for st, k in zip(v.stages, keep, strict=True)]
    costs = replace(v.costs, b=[b + x for b, x in zip(v.costs.b, more, strict=True)])
    model = replace(costs.model(replace(lay, P=S), recompute_counts(actions)), jitter=0.0)
    sim = simulate_devices(placed, model)
    aware = replace(v, layout=lay, costs=costs, memory=memory, actions=actions, sim=sim)
    aware.placed, aware.keep, aware.alphas = placed, keep, alphas
    note = "stage-aware recomputation (Merak 5.2) per V device: alpha " + ", ".join(
        f"{alphas[d]:.2f}" for d in range(P)
    )
    note += f"; {aware.step:.4g} s/step vs {v.step:.4g} s/step with full recomputation"
    ranked = [aware, *found.ranked[1:]]
    return Search(ranked, found.rejected, [*found.explanation, note], found.pruned)


def _device_ratios(cal, stages, peaks, m: int, cap: float, P: int):
    """(keep per stage, alpha per stage, memory per device), or None: each device's
    largest alpha that fits ``cap``."""
    from jobctl.engine.planner.stage_aware import STEP, _memory

    keep, alphas, memory = [0] * (2 * P), [0.0] * (2 * P), [0.0] * P
    for d, pair in enumerate(v_placement(P)):
        for k in range(round(1 / STEP), -1, -1):
            trial = list(keep)
            for s in pair:
                trial[s] = math.floor(k * STEP * len(stages[s]) + 1e-9)
            need = _memory(cal, stages, peaks, m, trial)
            if sum(need[s] for s in pair) <= cap:
                keep, memory[d] = trial, sum(need[s] for s in pair)
                for s in pair:
                    alphas[s] = round(k * STEP, 2)
                break
        else:
            return None
    return keep, alphas, memory


def v_stage_plans(win: VCandidate, by_device: list[list[int]]) -> tuple[list[StagePlan], dict]:
    """The 2P stage plans (each on its device's ranks) and the plan's V fields."""
    P = win.layout.P
    host = {s: d for d, pair in enumerate(v_placement(P)) for s in pair}
    stages = [
        StagePlan(
            index=s,
            blocks=blocks,
            ranks=by_device[host[s]],
            recompute=win.layout.recompute,
            keep_blocks=None if win.keep is None else win.keep[s],
            alpha=None if win.alphas is None else win.alphas[s],
            actions=" ".join(map(str, win.actions[s])),
        )
        for s, blocks in enumerate(win.stages)
    ]
    fields = {
        "placement": [list(pair) for pair in v_placement(P)],
        "device_actions": [device_text(acts) for acts in win.placed],
    }
    return stages, fields
