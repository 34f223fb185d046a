"""One simulated step at any number of micro-batches, from a few small simulations.

A pipeline schedule's lists are a warm-up, a middle that repeats every few
micro-batches, and a cool-down; a generator for M + k micro-batches writes the same
lists as for M with whole periods more in the middle. With deterministic costs the
simulated step is then, from some M on, periodic in M: T(M + k) - T(M) is one constant
for every k-multiple of the period (the max-plus cycle time of the repeated middle).
``steady_simulate`` simulates the schedule at M0 and M0 + k micro-batches (M0 about
P + k and congruent to M modulo k, a multiple of every period seen: ``PERIOD``).
Where every stage's end grew by one and the same amount, and no slower than the
busiest stage's own work (slower means slack from the warm-up is still being used
up: a Varuna list at P=10 turns from 5.13 to 5.42 s per micro-batch at M ~ 60), it
simulates about twice M0 and requires every stage's end there to lie on the same
line (which a second period of the same increment would only repeat), then
extrapolates each stage's end and busy time linearly to M; otherwise it retries from
that larger size, and simulates M itself once the runs would cost as much. Nothing
here looks at action kinds: any schedule whose generator repeats (F, R, B, W, ...) is
covered, and one that does not falls back to the full simulation.
``tests/unit/test_steady.py`` checks the result equals the full simulation (to 1e-9)
over many shapes, schedules and costs.

With jittered sends the increments are noisy and never exactly equal: the slope is
taken between simulations at M0 and M0 + ``JITTER_WINDOW``, once the pipeline's end
grows no slower than the busiest stage's own work (``JITTER_SLACK``; slower is
warm-up slack being used up, as above: the window moves on). That keeps the step
within 1 % of the full jittered simulation at moderate jitter (tested over many
shapes; a fixed start at 4 P, without the work check, was 1.8 % off on Varuna lists
whose slack lasts beyond it). The error is the rest of the step's own jitter, which
no extrapolation predicts: with heavy jitter (0.5 on sends of half a forward) a
Varuna step at P = 4-36 is up to 1.2 % off (the fixed start at 4 P: 2.5 %).
"""

from __future__ import annotations

from collections.abc import Callable

from jobctl.engine.core.actions import Action
from jobctl.engine.planner.simulator.simulation import CostModel, SimResult, simulate

PERIOD = 12  # a multiple of the periods the generators show (1 for 1F1B, 3 or 6 Varuna)
JITTER_WINDOW = 8 * PERIOD  # jittered: the slope over this many micro-batches
JITTER_SLACK = 1e-3  # jittered: the end may grow this much slower than the work (noise)
TOLERANCE = 1e-9  # relative: increments this close are equal (float rounding only)
Generator = Callable[[int], list[list[Action]]]


class _FullTimeline:
    """Events of an extrapolated result: the full simulation, run when first asked."""

    def __init__(self, make: Generator, M: int, costs: CostModel, seed: int) -> None:
        self.args = make, M, costs, seed

    def recosted(self, costs: CostModel) -> _FullTimeline:
        make, M, _, seed = self.args
        return _FullTimeline(make, M, costs, seed)

    def timeline(self):
        make, M, costs, seed = self.args
        return simulate(make(M), costs, seed)._engine.timeline()


def steady_simulate(make: Generator, M: int, costs: CostModel, seed: int = 0) -> SimResult:
    """The step of ``make(M)`` under ``costs``, extrapolated from small simulations
    where the schedule has reached its periodic steady state (see the module)."""
    P, k = costs.P, PERIOD
    start = P + k
    M0 = M - (M - start) // k * k if start < M else M  # congruent to M, >= start
    if costs.jitter > 0 and P > 1:
        return _jittered(make, M, M0, costs, seed)
    # The runs below cost about 4 (M0 + k) micro-batches: below that, simulate M itself.
    while 4 * (M0 + k) < M:
        runs = [simulate(make(M0 + j * k), costs, seed) for j in range(2)]
        check = M0 + (M0 // k + 2) * k  # about twice M0 (below M), congruent to M too
        if _periodic(runs):
            seen = simulate(make(check), costs, seed)
            guess = _extrapolated(runs, M0, check, make, costs, seed)
            if _same(seen, guess):  # the same increment, and no slower regime by 2 M0
                return _extrapolated([runs[0], seen], M0, M, make, costs, seed)
        M0 = check
    return simulate(make(M), costs, seed)


def _jittered(make: Generator, M: int, M0: int, costs: CostModel, seed: int) -> SimResult:
    """Jittered sends: the slope over ``JITTER_WINDOW`` micro-batches from M0 on, where
    the end grows no slower than the busiest stage's work (see the module)."""
    while 2 * (2 * M0 + JITTER_WINDOW) <= M:  # the runs cost under half of M itself
        runs = [simulate(make(n), costs, seed) for n in (M0, M0 + JITTER_WINDOW)]
        grown = max(runs[1].stage_end) - max(runs[0].stage_end)
        work = max(y - x for x, y in zip(runs[0].busy, runs[1].busy, strict=True))
        if grown >= work * (1 - JITTER_SLACK):
            return _extrapolated(runs, M0, M, make, costs, seed)
        M0 += JITTER_WINDOW
    return simulate(make(M), costs, seed)


def _same(a: SimResult, b: SimResult) -> bool:
    tol = TOLERANCE * max(a.step_time, 1e-300)
    return all(abs(x - y) <= tol for x, y in zip(a.stage_end, b.stage_end, strict=True))


def _periodic(runs: list[SimResult]) -> bool:
    """Did every stage's end grow by one and the same amount from run 0 to 1? (In the
    steady state every stage runs at the pipeline's one cycle rate; a transient moves
    stages by different amounts.)"""
    tol = TOLERANCE * max(runs[1].step_time, 1e-300)
    grown = [y - x for x, y in zip(runs[0].stage_end, runs[1].stage_end, strict=True)]
    # No stage runs faster than its own work: while the ends grow slower than the
    # busiest stage's compute, slack from the warm-up is still being used up.
    work = max(y - x for x, y in zip(runs[0].busy, runs[1].busy, strict=True))
    return max(grown) - min(grown) <= tol and min(grown) >= work - tol


def _extrapolated(
    runs: list[SimResult], M0: int, M: int, make: Generator, costs: CostModel, seed: int
) -> SimResult:
    """A SimResult at M, linear per stage through the first and last of ``runs`` (at
    M0 and at M0 + k, or at the size that verified the steady state: ``_size``)."""
    first, last = runs[0], runs[-1]
    at = _size(last)
    per = (M - at) / (at - M0)  # how far beyond the last run, in its distance from M0

    def grow(x: float, y: float) -> float:
        return y + (y - x) * per

    end = tuple(grow(x, y) for x, y in zip(first.stage_end, last.stage_end, strict=True))
    busy = tuple(grow(x, y) for x, y in zip(first.busy, last.busy, strict=True))
    pipeline = max(end)
    critical = max(busy)
    step = max(e + a + o for e, a, o in zip(end, costs.ar, costs.opt, strict=True))
    return SimResult(
        step_time=step,
        pipeline_time=pipeline,
        busy=busy,
        idle=tuple(pipeline - x for x in busy),
        stage_end=end,
        bubble_ratio=(pipeline - critical) / critical if critical > 0 else 0.0,
        executed=last.executed,  # the largest run's order (same peaks as at M)
        deviations=round(grow(first.deviations, last.deviations)),
        _engine=_FullTimeline(make, M, costs, seed),  # type: ignore[arg-type]
    )


def _size(result: SimResult) -> int:
    """The number of micro-batches a result simulated (its first stage's forwards)."""
    return 1 + max(a.micro_batch for a in result.executed[0])
