"""What a plan shows of its search, and which candidates cannot enter it (pruning).

A plan (``resolver``) shows the winner and ``TOP_ALTERNATIVES`` runners-up, each P's
best and three more (``sweep_lines``), and the first ``TOP_REJECTED`` rejected
candidates by (fits memory first, bound). The search evaluates candidates in bound
order. A candidate whose ``step_floor`` (a step no schedule of it can beat) is above
the step of the ``KEEP_OVERALL``-th fastest one simulated so far and of its P's
``KEEP_PER_P``-th would rank below all of them, now and after any later simulation,
so it is in none of those lists and is not simulated (``Search.pruned``). Before its
memory is checked it is skipped only once ``KEEP_REJECTED`` candidates that did not fit
memory, with bounds no higher, were rejected ahead of it: had it not fit either, it
would have been listed after them. The plan is then exactly the exhaustive search's
(``tests/unit/test_planner_search.py``). Only where the search's order is the plan's:
an objective or budget that weighs money chooses among every simulated layout, and
there the search prunes nothing more than bounds that cannot beat the fastest.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from typing import TYPE_CHECKING

from jobctl.engine.core.plan import idle_share

if TYPE_CHECKING:
    from jobctl.engine.planner.search import Candidate

KEEP_OVERALL = 9  # resolver: the winner and its TOP_ALTERNATIVES (8) runners-up
KEEP_PER_P = 4  # sweep_lines: each P's best and three more
KEEP_REJECTED = 4  # resolver.TOP_REJECTED
MARGIN = 1e-9  # relative: rank_key rounds steps to 1e-12, a floor this far above cannot tie


class Shortlist:
    """The steps a plan could still show, as the search simulates candidates."""

    def __init__(self) -> None:
        self.overall: list[float] = []  # the KEEP_OVERALL fastest steps, ascending
        self.per_P: dict[int, list[float]] = {}  # per P, its KEEP_PER_P fastest
        self.unfit: list[float] = []  # bounds of the rejected that did not fit memory
        self.pruned: list[Candidate] = []  # skipped: no plan could show them

    def ranked(self, cand: Candidate) -> None:
        """Count a simulated candidate."""
        _keep(self.overall, cand.step, KEEP_OVERALL)
        _keep(self.per_P.setdefault(cand.layout.P, []), cand.step, KEEP_PER_P)

    def rejected(self, cand: Candidate) -> None:
        """Count a rejected candidate (those with memory did not fit it)."""
        if cand.memory:
            insort(self.unfit, cand.bound)

    def cutoff(self, cand: Candidate) -> float | None:
        """The step above which ``cand`` could not be shown; None while it could be at
        any step (fewer than the lists hold, or its memory could still list it)."""
        mine = self.per_P.get(cand.layout.P, ())
        if len(self.overall) < KEEP_OVERALL or len(mine) < KEEP_PER_P:
            return None
        if not cand.memory and bisect_right(self.unfit, cand.bound) < KEEP_REJECTED:
            return None
        return max(self.overall[-1], mine[-1]) * (1 + MARGIN)


def _keep(steps: list[float], step: float, k: int) -> None:
    """Insert ``step`` into the ascending ``steps``, keeping the k smallest."""
    if len(steps) < k or step < steps[-1]:
        insort(steps, step)
        del steps[k:]


def sweep_lines(Ps, ranked: list[Candidate], rejected: list[Candidate]) -> list[str]:
    """One line per P: its best simulated layout and up to three more, or why it has
    none (``KEEP_PER_P`` in all)."""
    out = []
    for P in Ps:
        mine = [c for c in ranked if c.layout.P == P]
        if mine:
            best = mine[0]
            others = ", ".join(
                f"{c.layout.schedule}{'+R' if c.layout.recompute else ''} {c.step:.4g} s"
                for c in mine[1:KEEP_PER_P]
            )
            note = f" [{best.note}]" if best.note else ""
            out.append(
                f"  P={P}: best {best.layout.label()} {best.step:.4g} s/step, "
                f"idle {100 * idle_share(best.sim.bubble_ratio):.1f} %{note}"
                + (f"; also {others}" if others else "")
            )
        else:
            why = next((c.why_not for c in rejected if c.layout.P == P), "no candidate")
            out.append(f"  P={P}: none ({why})")
    return out
