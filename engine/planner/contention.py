"""Core sharing: a plan's costs stretched by how many processes compute at once.

On CPU workers that share a host's cores, compute slows with the number of processes
computing at the same instant (``HostCalibration.factor``); ``contend`` simulates to a
fixed point of that slowdown, prices messages at the plan's load where the calibration
measured the runtime, and makes each allreduce wait for its slowest replica
(``replica_skew``).
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Callable, Sequence

from jobctl.engine.calibration.record import Calibration
from jobctl.engine.core.actions import Action
from jobctl.engine.planner.simulator.simulation import CostModel, SimResult, simulate
from jobctl.engine.planner.stage_costs import with_message

CONTENTION_ROUNDS = 6
Factor = Callable[[float], float]  # slowdown when this many processes compute at once


def demand(result: SimResult, D: int) -> float:
    """Processes computing at once, on average, in ``result`` (``D`` pipelines alike)."""
    return D * sum(result.busy) / result.pipeline_time if result.pipeline_time > 0 else 0.0


def contend(
    cal: Calibration,
    actions: list[list[Action]],
    base: CostModel,
    D: int,
    seed: int = 0,
    messages: bool = True,
) -> tuple[CostModel, SimResult]:
    """Simulate with compute stretched by core sharing, to a fixed point.

    Each round simulates, then gives each stage the time-averaged slowdown its compute
    saw (``host.factor`` of D x the stages computing at each instant: replicas run in
    step) and simulates again; each stage's optimizer step gets the factor of the
    ranks whose optimizer steps overlap it (``_optimizer_factors``: stages finish their
    schedules at different times, the last one often alone). With ``messages``, each
    message costs what the plan's compute demand says (``_priced_messages``). Damped, a
    few rounds settle it. Last, each stage's allreduce waits for the slowest of its
    replicas at that demand (``replica_skew``).
    """
    factor = cal.host.factor
    costs, result = base, simulate(actions, base, seed)
    load = demand(result, D)
    if messages:
        base = _priced_messages(cal, base, load)
    factors, opt = [1.0] * base.P, list(base.opt)
    for _ in range(CONTENTION_ROUNDS):
        seen = _compute_factors(result, base.P, D, factor)
        factors = [(a + b) / 2 for a, b in zip(factors, seen, strict=True)]
        opt_k = _optimizer_factors(result, base.ar, opt, D, factor)
        opt = [x * k for x, k in zip(base.opt, opt_k, strict=True)]
        costs = dataclasses.replace(
            base,
            f=[x * k for x, k in zip(base.f, factors, strict=True)],
            b=[x * k for x, k in zip(base.b, factors, strict=True)],
            r=[x * k for x, k in zip(base.r, factors, strict=True)],
            opt=opt,
        )
        result = simulate(actions, costs, seed)
    return replica_skew(cal, actions, costs, result, D, load, seed)


def _priced_messages(cal: Calibration, base: CostModel, load: float) -> CostModel:
    """``base`` (at the idle probe's message cost) with every message at ``load``'s cost.

    ``RuntimeCalibration.message_at`` the processes computing at once in the plain
    simulation of ``base``, measured as the probes' loads were, so it depends on the plan
    alone, never on the message time it selects. Only with a measured runtime whose busy
    probe was busier than its idle one. The planner asks for it where ranks outnumber
    the host's cores: with a core each, a woken receiver never waits for one, and the
    busy probe's regime does not apply (a 2-rank pipeline had its messages priced toward
    the 4-rank probe's and came out 23 % slow).
    """
    rt = cal.runtime
    if rt is None or rt.load_busy <= rt.load_idle:
        return base
    extra = rt.message_at(load) - rt.message_s
    return dataclasses.replace(
        base, act=with_message(base.act, extra), grad=with_message(base.grad, extra)
    )


def replica_skew(
    cal: Calibration,
    actions: list[list[Action]],
    costs: CostModel,
    result: SimResult,
    D: int,
    load: float,
    seed: int = 0,
) -> tuple[CostModel, SimResult]:
    """``costs`` and ``result`` with each stage's allreduce waiting for its slowest replica.

    The simulator runs one pipeline for all D; real replicas' runs vary from step to
    step (``RuntimeCalibration.cv_at`` the plan's ``load``: one rank's relative spread
    in the probes), and a stage's gradient sum starts when the last of its D replicas
    is done: on average ``expected_max(D)`` standard deviations after the typical one.
    Two replicas on this 2-core host ended their runs 3 ms apart at the median (mean
    4.4 ms) in 30 ms steps. Nothing without a measured runtime or with one replica.
    """
    rt = cal.runtime
    if D < 2 or rt is None:
        return costs, result
    spread = expected_max(D) * rt.cv_at(load)
    if spread <= 0:
        return costs, result
    ar = [a + spread * end for a, end in zip(costs.ar, result.stage_end, strict=True)]
    costs = dataclasses.replace(costs, ar=ar)
    return costs, simulate(actions, costs, seed)


@functools.cache
def expected_max(n: int) -> float:
    """Mean of the largest of ``n`` independent standard normal draws (0 for one):
    the integral of x n phi(x) Phi(x)^(n-1), by the midpoint rule."""
    if n < 2:
        return 0.0
    normal, lo, hi, steps = statistics.NormalDist(), -9.0, 9.0, 4000
    dx = (hi - lo) / steps
    total = 0.0
    for i in range(steps):
        x = lo + (i + 0.5) * dx
        total += x * n * normal.pdf(x) * normal.cdf(x) ** (n - 1)
    return total * dx


def _optimizer_factors(
    result: SimResult, ar: Sequence[float], opt: Sequence[float], D: int, factor: Factor
) -> list[float]:
    """Per stage, the slowdown of its optimizer step: ``factor`` of D x the stages whose
    steps overlap its own (each counted by the share of it they overlap)."""
    end = result.stage_end
    spans = [(end[s] + a, end[s] + a + o) for s, (a, o) in enumerate(zip(ar, opt, strict=True))]
    out = []
    for a, b in spans:
        if b <= a:
            out.append(1.0)
            continue
        k = sum(max(0.0, min(b, d) - max(a, c)) for c, d in spans) / (b - a)
        out.append(factor(D * k))
    return out


def _compute_factors(result: SimResult, P: int, D: int, factor: Factor) -> list[float]:
    """Per stage, its compute-time-weighted mean slowdown factor."""
    edges = []
    for e in result.events:
        if e.kind == "compute" and e.end > e.start:
            edges += [(e.start, 1, e.stage), (e.end, -1, e.stage)]
    edges.sort(key=lambda x: (x[0], x[1]))
    active: set[int] = set()
    weight, total = [0.0] * P, [0.0] * P
    last = 0.0
    for t, kind, s in edges:
        if active and t > last:
            k = factor(D * len(active))
            for a in active:
                weight[a] += (t - last) * k
                total[a] += t - last
        last = t
        if kind > 0:
            active.add(s)
        else:
            active.discard(s)
    return [w / t if t > 0 else 1.0 for w, t in zip(weight, total, strict=True)]
