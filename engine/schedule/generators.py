"""Pipeline schedule generators: per-stage action lists for P stages and M micro-batches.

Every generator returns ``list[list[Action]]``, one list per stage, in the order the
stage runs them; sends and receives are implied by data flow (see ``actions``). The
closed forms below assume uniform stages, backward = 2 x forward and, where there is
recompute, recompute = forward (Merak sec. 5.1); ``tests/unit/test_simulator.py`` checks
each one against the simulator.

* ``gpipe``: all forwards, then all backwards in micro-batch order (AvgPipe's AFAB).
  Bubble ratio (P-1)/M.
* ``1f1b``: PipeDream-flush one-forward-one-backward; stage s warms up with
  min(P-1-s, M) forwards. Bubble ratio (P-1)/M. With ``recompute=True`` every stage
  runs R(i) right before B(i); R needs nothing from another stage, so it runs as soon as
  the stage is free, before the gradient arrives: Merak's "1F1B + early recompute"
  (Fig. 3b), bubble ratio 3(P-1)/(4M).
* ``shifted_critical_path``: Merak Fig. 3c; bubble ratio 3(P-2)/(4M) for M >= 3
  (see ``shifted_critical_path``).
* ``varuna``: Varuna's rule-based schedule, produced by a list scheduler that enforces
  rules 1-3 of sec. 3.2 (``schedules_varuna``).
* ``advance_forward``: AvgPipe Alg. 1, between 1F1B and all-forward-all-backward.
* ``zb_h1``: zero-bubble ZB-H1 (``zero_bubble``): the backward split into B and W,
  1F1B's memory, bubble ratio (P-1)/(3M) with T_F = T_B = T_W, for M >= P.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from jobctl.engine.core.actions import Action, B, F, R
from jobctl.engine.schedule.checks import ActivationPeak, peak_activations, validate
from jobctl.engine.schedule.varuna import varuna
from jobctl.engine.schedule.zero_bubble import zb_h1

__all__ = [
    "SCHEDULES",
    "ActivationPeak",
    "advance_forward",
    "advance_num_range",
    "generate",
    "gpipe",
    "one_f_one_b",
    "peak_activations",
    "shifted_critical_path",
    "validate",
    "varuna",
    "zb_h1",
]


def _check_sizes(P: int, M: int) -> None:
    if P < 1 or M < 1:
        raise ValueError(f"need P >= 1 stages and M >= 1 micro-batches, got P={P}, M={M}")


@lru_cache(maxsize=16)
def _actions(M: int) -> tuple[tuple[Action, ...], tuple[tuple[Action, ...], ...]]:
    """F(i), and the backward task of i without and with recompute, for i < M.

    Actions are immutable, so every stage list can share them; building them once per
    M keeps generating large schedules cheap.
    """
    return tuple(F(i) for i in range(M)), tuple(((B(i),), (R(i), B(i))) for i in range(M))


def _interleaved(M: int, warmup: int, recompute: bool) -> list[Action]:
    """``warmup`` forwards, then F(i+warmup) R(i) B(i) pairs, then the remaining backwards.

    This is the shape of one stage in 1F1B and in AvgPipe's Alg. 1 (lines 3-8), with the
    backwards deferred by the warm-up run afterwards in micro-batch order.
    """
    forwards, backward_tasks = _actions(M)
    warmup = min(warmup, M)
    actions = list(forwards[:warmup])
    for i in range(M - warmup):
        actions.append(forwards[i + warmup])
        actions += backward_tasks[i][recompute]
    for i in range(M - warmup, M):
        actions += backward_tasks[i][recompute]
    return actions


def gpipe(P: int, M: int, recompute: bool = False) -> list[list[Action]]:
    """All forwards, then all backwards in micro-batch order (AvgPipe's AFAB).

    The backwards run in micro-batch order, like AvgPipe's AFAB (which advance forward
    propagation reaches at its maximum, ``advance_forward``) and
    ``torch.distributed.pipelining.ScheduleGPipe``; the GPipe paper and Varuna's Fig. 5
    run them in reverse order instead, which with recompute is one forward time
    shorter (P=4, M=5: 28 instead of 29 units).

    With ``recompute`` every stage recomputes every micro-batch right before its
    backward, except the last micro-batch on the last stage (Varuna sec. 3.2): the
    stage keeps that forward's activations, one micro-batch of extra memory, and saves
    one recompute on its critical backward chain.
    """
    _check_sizes(P, M)
    forwards, backward_tasks = _actions(M)
    stages = [list(forwards) for _ in range(P)]
    for s, actions in enumerate(stages):
        for i in range(M):
            keep = s == P - 1 and i == M - 1
            actions += backward_tasks[i][recompute and not keep]
    return stages


def one_f_one_b(P: int, M: int, recompute: bool = False) -> list[list[Action]]:
    """PipeDream-flush 1F1B: stage s warms up with min(P-1-s, M) forwards.

    Stage s then keeps at most min(P-s, M) micro-batches' activations. With
    ``recompute`` every stage (the last included, as in Merak Fig. 3b) runs R(i) right
    before B(i); executed as soon as the stage is free, that is early recompute.
    """
    _check_sizes(P, M)
    return [_interleaved(M, P - 1 - s, recompute) for s in range(P)]


def shifted_critical_path(P: int, M: int) -> list[list[Action]]:
    """Merak's shifted critical path schedule (sec. 5.1, Fig. 3c).

    1F1B with early recompute, except that (a) the last stage never recomputes (it
    keeps one micro-batch at a time anyway) and (b) the penultimate stage pulls its
    third forward F2 ahead of R0 B0, filling the bubble while the last stage works on
    micro-batch 0: ``F0 F1 F2 R0 B0 R1 B1 F3 R2 B2 F4 ...``. The penultimate stage then
    runs without a stall and becomes the critical path: with uniform stages the step
    takes 4M + 3(P-2) forward times, bubble ratio 3(P-2)/(4M), for any M >= 3. With
    M <= 2 there is no third forward to pull ahead, the critical path stays on the last
    stage and the step takes 3 - M units more. With P = 1 this is plain F B F B ... on
    the one stage.
    """
    _check_sizes(P, M)
    stages = [_interleaved(M, P - 1 - s, recompute=True) for s in range(P - 1)]
    stages.append(_interleaved(M, 0, recompute=False))
    if P >= 2 and M >= 3:
        penultimate = stages[P - 2]
        penultimate.remove(F(2))
        penultimate.insert(penultimate.index(R(0)), F(2))
    return stages


def advance_num_range(P: int, M: int) -> tuple[int, int]:
    """Smallest (1F1B) and largest (all-forward-all-backward) ``advance_num``."""
    _check_sizes(P, M)
    return P - 1, M + P - 2


def advance_forward(P: int, M: int, advance_num: int | None = None) -> list[list[Action]]:
    """AvgPipe's advance forward propagation (sec. 4.2, Alg. 1).

    ``advance_num`` is Alg. 1's variable: the number of forwards the first stage runs in
    advance, before it starts to alternate one forward with one backward. Alg. 1 is
    written for the first GPU; stage s runs ``min(advance_num - s, M)`` forwards in
    advance, just as 1F1B's warm-up K-1 on the first GPU is K-1-s on stage s, so
    adjacent stages keep 1F1B's gap of one micro-batch. Stage s then keeps at most
    ``min(advance_num - s + 1, M)`` micro-batches' activations.

    * ``advance_num = P - 1`` (Alg. 1 line 1) is exactly 1F1B: no micro-batch is
      propagated "in advance" beyond 1F1B's warm-up;
    * each increment forwards one more micro-batch ahead on every stage;
    * ``advance_num = M + P - 2`` gives every stage, the last included, M - 1 forwards
      in advance, which is all-forward-all-backward, exactly ``gpipe(P, M)``.

    No recompute (AvgPipe keeps activations). Values outside that range are rejected.
    The default, ``P``, forwards one micro-batch ahead of 1F1B, as in AvgPipe Fig. 7c.
    """
    low, high = advance_num_range(P, M)
    if advance_num is None:
        advance_num = min(P, high)
    if not low <= advance_num <= high:
        raise ValueError(
            f"advance_num={advance_num} is outside [{low}, {high}] for P={P}, M={M}: "
            f"{low} is 1F1B, {high} is all-forward-all-backward"
        )
    return [_interleaved(M, advance_num - s, recompute=False) for s in range(P)]


Generator = Callable[..., list[list[Action]]]

SCHEDULES: dict[str, Generator] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "varuna": varuna,
    "shifted_critical_path": shifted_critical_path,
    "advance_forward": advance_forward,
    "zb_h1": zb_h1,
}


def generate(name: str, P: int, M: int, **options: object) -> list[list[Action]]:
    """Generate schedule ``name`` for P stages and M micro-batches.

    ``options`` go to the generator (``recompute`` for gpipe, 1f1b and zb_h1, ``advance_num``
    for advance_forward). Unknown names raise ValueError listing the valid ones.
    """
    try:
        generator = SCHEDULES[name]
    except KeyError:
        valid = ", ".join(sorted(SCHEDULES))
        raise ValueError(f"unknown schedule {name!r}; valid schedules: {valid}") from None
    return generator(P, M, **options)
