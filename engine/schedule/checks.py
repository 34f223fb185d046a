"""Checks on schedules: validity of per-stage action lists and their activation memory.

``validate`` rejects a schedule the runtime could not execute (a missing or repeated
action, a recompute out of place, a cross-stage wait cycle) with a message naming the
stage, the action and its position. ``peak_activations`` counts what a stage holds.
"""

from __future__ import annotations

from itertools import accumulate
from operator import attrgetter
from typing import NamedTuple

from jobctl.engine.core.actions import Action, Op, recomputed, weight_split

_op = attrgetter("op")


class ActivationPeak(NamedTuple):
    """Most micro-batches a stage holds at once, by kind of state.

    ``full``: full activations (an autograd graph), held from a kept forward, or from a
    recompute, until the backward (until the W of a split backward). ``stashed``:
    only the stage input, held from a forward that will be recomputed until its
    recompute.
    """

    full: int
    stashed: int


def peak_activations(stage_actions: list[Action]) -> ActivationPeak:
    """Peak full and stashed-input micro-batch counts of one stage's action list.

    An F whose micro-batch is not recomputed holds full activations until its B; an F
    that will be recomputed holds only its input until the R, then full activations
    until the B. 1F1B without recompute gives ``full = min(P - s, M)`` on stage s. A
    micro-batch with a W holds its activations until the W, not the B.
    """
    fwd, rcp, wgt = Op.FORWARD, Op.RECOMPUTE, Op.WEIGHT
    ops = set(map(_op, stage_actions))  # most lists have no R or no W: skip their sets
    rec = recomputed(stage_actions) if rcp in ops else set()
    split = weight_split(stage_actions) if wgt in ops else set()
    # Running sums of +1/-1 per action (one pass in C, the planner calls this a lot).
    full = [
        (a.micro_batch not in rec)
        if a.op is fwd
        else 1
        if a.op is rcp
        else -1
        if a.op is wgt or a.micro_batch not in split
        else 0
        for a in stage_actions
    ]
    stashed = (
        [(a.op is fwd and a.micro_batch in rec) - (a.op is rcp) for a in stage_actions]
        if rec
        else []
    )
    return ActivationPeak(
        max(0, *accumulate(full)) if full else 0,
        max(0, *accumulate(stashed)) if stashed else 0,
    )


def validate(stages: list[list[Action]], P: int, M: int, *, varuna_rules: bool = False) -> None:
    """Raise ValueError, naming stage, action and position, if the schedule is invalid.

    Checks, per stage: exactly one F and one B per micro-batch 0..M-1, F before B, at
    most one R per micro-batch and only between its F and its B, a W after its B for
    every micro-batch or for none (a stage splits all its backwards or none). Across stages: the
    lists can run to completion (a forward waits for the previous stage's forward, a
    backward for the next stage's backward); a wait cycle is reported as a deadlock.
    With ``varuna_rules``: no forward between R(i) and B(i) (Varuna rule 2) and no
    recompute on the last stage.
    """
    if len(stages) != P:
        raise ValueError(f"schedule has {len(stages)} stages, expected P={P}")
    for s, actions in enumerate(stages):
        _check_stage(s, actions, M)
        if varuna_rules:
            _check_varuna_rules(s, actions, last=s == P - 1)
    _check_feasible(stages)


def _positions(s: int, actions: list[Action], M: int) -> dict[Action, int]:
    where: dict[Action, int] = {}
    for k, a in enumerate(actions):
        if not 0 <= a.micro_batch < M:
            raise ValueError(f"stage {s}: {a} at position {k} is outside micro-batches 0..{M - 1}")
        if a in where:
            raise ValueError(f"stage {s}: {a} appears twice, at positions {where[a]} and {k}")
        where[a] = k
    return where


def _check_stage(s: int, actions: list[Action], M: int) -> None:
    where = _positions(s, actions, M)
    for op in (Op.FORWARD, Op.BACKWARD):
        missing = [i for i in range(M) if Action(op, i) not in where]
        if missing:
            raise ValueError(f"stage {s}: no {op.value} for micro-batches {missing}")
    for i in range(M):
        f, b = where[Action(Op.FORWARD, i)], where[Action(Op.BACKWARD, i)]
        if b < f:
            raise ValueError(f"stage {s}: B{i} at position {b} comes before F{i} at {f}")
        r = where.get(Action(Op.RECOMPUTE, i))
        if r is not None and not f < r < b:
            raise ValueError(
                f"stage {s}: R{i} at position {r} must come after F{i} (position {f}) "
                f"and before B{i} (position {b})"
            )
    _check_split(s, where, M)


def _check_split(s: int, where: dict[Action, int], M: int) -> None:
    """A W comes after its B, and a stage has a W for every micro-batch or none."""
    split = [i for i in range(M) if Action(Op.WEIGHT, i) in where]
    if split and len(split) < M:
        missing = [i for i in range(M) if i not in split]
        raise ValueError(
            f"stage {s}: W for micro-batches {split} but not for {missing}: a stage "
            "splits every backward into B and W, or none"
        )
    for i in split:
        w, b = where[Action(Op.WEIGHT, i)], where[Action(Op.BACKWARD, i)]
        if w < b:
            raise ValueError(f"stage {s}: W{i} at position {w} comes before B{i} at {b}")


def _check_varuna_rules(s: int, actions: list[Action], last: bool) -> None:
    open_recompute: Action | None = None
    for k, a in enumerate(actions):
        if a.op is Op.RECOMPUTE:
            if last:
                raise ValueError(f"stage {s}: {a} at position {k}: the last stage never recomputes")
            open_recompute = a
        elif a.op is Op.FORWARD and open_recompute is not None:
            raise ValueError(
                f"stage {s}: {a} at position {k} runs between {open_recompute} and "
                f"B{open_recompute.micro_batch} (Varuna rule 2)"
            )
        elif a.op is Op.BACKWARD and open_recompute is not None:
            open_recompute = None


def _check_feasible(stages: list[list[Action]]) -> None:
    """Run the lists in data-flow order; every stage must reach its end."""
    P = len(stages)
    pos = [0] * P
    done: list[set[Action]] = [set() for _ in range(P)]
    progress = True
    while progress:
        progress = False
        for s in range(P):
            while pos[s] < len(stages[s]) and _ready(stages, done, s, stages[s][pos[s]]):
                done[s].add(stages[s][pos[s]])
                pos[s] += 1
                progress = True
    blocked = [s for s in range(P) if pos[s] < len(stages[s])]
    if blocked:
        waits = "; ".join(_wait_reason(stages[s][pos[s]], s, pos[s]) for s in blocked)
        raise ValueError(f"schedule deadlocks: {waits}")


def _ready(stages: list[list[Action]], done: list[set[Action]], s: int, a: Action) -> bool:
    if a.op is Op.FORWARD and s > 0:
        return a in done[s - 1]
    if a.op is Op.BACKWARD and s < len(stages) - 1:
        return a in done[s + 1]
    return True


def _wait_reason(a: Action, s: int, k: int) -> str:
    if a.op is Op.FORWARD:
        what = f"the activation of F{a.micro_batch} on stage {s - 1}"
    else:
        what = f"the gradient of B{a.micro_batch} on stage {s + 1}"
    return f"stage {s} waits at {a} (position {k}) for {what}"
