"""Varuna's rule-based schedule (Varuna sec. 3.2), produced the way the paper does it.

Varuna's static schedule comes from "a tool that enforces the following constraints":

1. if stage k completes the backward of micro-batch m at time t, the recompute of m on
   stage k-1 is scheduled at t' with t - t' >= T_f: it is done when the gradient
   arrives, and not earlier than needed (just in time);
2. once a recompute has completed, the stage waits for the matching backward: no
   forward in between (it would hold a second set of activations);
3. when a forward and a backward are both ready, the backward runs;

and the last stage never recomputes. The tool here is a discrete-time list scheduler
over uniform stages with forward = recompute = 1 time unit and backward = 2 (the
costs of Varuna's Fig. 5) and no communication time; the order in which each stage
ran its actions is the schedule. Stages before the last keep only their inputs on a
forward, so they run any forward that is ready while no backward work is due, which
spreads forwards through the schedule (Fig. 5, stage 3).
"""

from __future__ import annotations

from functools import lru_cache

from jobctl.engine.core.actions import Action, B, F, R

T_F, T_R, T_B = 1, 1, 2  # uniform costs in forward-time units (Fig. 5)


def varuna(P: int, M: int) -> list[list[Action]]:
    """Varuna's schedule for P stages and M micro-batches, one action list per stage."""
    if P < 1 or M < 1:
        raise ValueError(f"need P >= 1 stages and M >= 1 micro-batches, got P={P}, M={M}")
    return [list(actions) for actions in _varuna(P, M)]


@lru_cache(maxsize=128)
def _varuna(P: int, M: int) -> tuple[tuple[Action, ...], ...]:
    """The list scheduler: whole time units, stages decide downstream first at each t.

    Deciding downstream first lets stage k see, at time t, a backward that stage k+1
    starts at t, so it knows when that gradient arrives and can time its recompute.
    """
    never = 1 << 62
    forwards, recomputes, backwards = ([op(i) for i in range(M)] for op in (F, R, B))
    free, next_f, next_b, recomputed = [0] * P, [0] * P, [0] * P, [False] * P
    f_end = [[never] * M for _ in range(P)]  # when F(i) on stage k ends
    grad_at = [[never] * M for _ in range(P - 1)] + [[0] * M]  # gradient arrival at k
    order: list[list[Action]] = [[] for _ in range(P)]
    finished = 0
    for t in range(8 * P * (M + P)):  # far beyond any makespan; guards the loop
        for k in reversed(range(P)):
            if free[k] > t:
                continue
            i, j = next_b[k], next_f[k]
            grad = grad_at[k][i] if i < j else never  # never: no backward due
            if i < j and (recomputed[k] or k == P - 1):  # rule 2: only the backward now
                if grad <= t:  # rule 3: the backward first
                    order[k].append(backwards[i])
                    if k > 0:
                        grad_at[k - 1][i] = t + T_B
                    recomputed[k], free[k], next_b[k] = False, t + T_B, i + 1
                    finished += i + 1 == M
            elif grad <= t + T_R:  # rule 1: done by the time the gradient arrives
                order[k].append(recomputes[i])
                recomputed[k], free[k] = True, t + T_R
            elif j < M and (k == 0 or f_end[k - 1][j] <= t):
                # In whole time units a forward still fits before R is due.
                order[k].append(forwards[j])
                f_end[k][j] = free[k] = t + T_F
                next_f[k] += 1
        if finished == P:
            return tuple(tuple(actions) for actions in order)
    raise RuntimeError(f"varuna schedule for P={P}, M={M} did not finish")
