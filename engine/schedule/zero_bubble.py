"""Zero-bubble schedules (Qi et al., arXiv 2401.10241): the backward split into B and W.

B (the gradient of the stage input) is all the previous stage waits for; W (the
weight gradients) has no one waiting, so it can fill the pipeline's bubbles.

* ``zb_h1``: the paper's ZB-H1 (sec. 2.1, Fig. 3 top). Stage s runs 1F1B's warm-up of
  min(P-1-s, M) forwards, then alternates F and B, and starts its W's s micro-batches
  late (PyTorch's ``ScheduleInterleavedZeroBubble`` with one stage per rank does the
  same): every stage then holds at most P micro-batches' activations (F to W), the
  first stage's 1F1B peak, and the cool-down fills with W's. With uniform stages and
  T_F = T_B = T_W (forward 1, whole backward 2, W 1) the step takes 3M + P - 1 units
  for M >= P: bubble (P-1)(T_F + T_B - T_W), ratio (P-1)/(3M), a third of 1F1B's.
  ``recompute=True`` runs R(i) right before B(i) (early recompute, as ``1f1b``); the
  recomputed activations are then held until W(i).
* ``zb_v``: the paper's ZB-V (sec. 6): 2P stages in V shape on P devices, one list
  of ``Placed`` actions per device (``placement``). With T_F = T_B = T_W per chunk
  (forward 1, whole backward 2) and M >= 2P-1 every device computes 6M and the step
  takes 6M + P - 1: the only idle time is the first micro-batch's way down to the last
  device, bubble ratio (P-1)/(6M), half ZB-H1's on the same model; each device holds
  at most 2P chunk micro-batches, 1F1B's first-stage peak of P whole stages.
  A job's ``parallelism.schedule: zb_v``: the planner makes the V variant of a
  searched layout (``planner.v_shape``), the plan places two stages per rank and
  ``runtime.two_stage`` runs them; ``generate`` knows only the one-stage-per-device
  schedules, so ``zb_v`` is called directly.
"""

from __future__ import annotations

from functools import lru_cache

from jobctl.engine.core.actions import Action, B, F, Op, R, W
from jobctl.engine.schedule.placement import Placed


def zb_h1(P: int, M: int, recompute: bool = False) -> list[list[Action]]:
    """ZB-H1 for P stages and M micro-batches, one action list per stage."""
    if P < 1 or M < 1:
        raise ValueError(f"need P >= 1 stages and M >= 1 micro-batches, got P={P}, M={M}")
    return [_zb_h1_stage(s, P, M, recompute) for s in range(P)]


@lru_cache(maxsize=16)
def _actions(M: int) -> tuple[tuple[Action, ...], ...]:
    """F(i), R(i), B(i), W(i) for i < M, built once per M and shared by every stage
    list (actions are immutable): building them dominated generating large schedules."""
    return tuple(tuple(make(i) for i in range(M)) for make in (F, R, B, W))


def _zb_h1_stage(s: int, P: int, M: int, recompute: bool) -> list[Action]:
    """Warm-up forwards, F B pairs, then the remaining B's; W(k) follows B(k + s)."""
    fs, rs, bs, ws = _actions(M)
    warmup = min(P - 1 - s, M)
    actions = list(fs[:warmup])
    weights = 0
    for i in range(M):
        if i + warmup < M:
            actions.append(fs[i + warmup])
        if recompute:
            actions.append(rs[i])
        actions.append(bs[i])
        if i >= s:  # W starts s micro-batches late: the gradient chain goes first
            actions.append(ws[weights])
            weights += 1
    actions += ws[weights:]
    return actions


def zb_v(P: int, M: int, recompute: bool = False) -> list[list[Placed]]:
    """ZB-V for P devices (2P stages in V shape, ``placement.v_placement``) and M
    micro-batches: one list of ``Placed`` actions per device.

    The paper's sec. 6 order (as PyTorch's ``ScheduleZBVZeroBubble``): device d warms
    up with 2(P-d)-1 forwards on its first stage d, then d pairs of forwards on its
    second stage 2P-1-d and its first, then P-d rounds F B W on the second stage; in
    the steady state it runs F B W on the first stage, then F B W on the second; the
    cool-down runs the remaining B's (the gradient chain first), then the W's. The
    order is built for max(M, 2P-1) micro-batches and the ones >= M dropped, so a
    small M keeps the shape. ``recompute=True`` runs R(i) right before every B(i).
    """
    if P < 1 or M < 1:
        raise ValueError(f"need P >= 1 devices and M >= 1 micro-batches, got P={P}, M={M}")
    return [_zb_v_device(d, P, M, recompute) for d in range(P)]


def _zb_v_device(d: int, P: int, M: int, recompute: bool) -> list[Placed]:
    """Device d's list: the (stage, op) order of ``_zb_v_order``, each (stage, op)
    numbering its micro-batches 0, 1, ... in turn."""
    count: dict[tuple[int, Op], int] = {}
    actions: list[Placed] = []
    for stage, op in _zb_v_order(d, P, max(M, 2 * P - 1)):
        i = count[stage, op] = count.get((stage, op), -1) + 1
        if i >= M:
            continue
        if recompute and op is Op.BACKWARD:
            actions.append(Placed(stage, R(i)))
        actions.append(Placed(stage, Action(op, i)))
    return actions


def _zb_v_order(d: int, P: int, n: int) -> list[tuple[int, Op]]:
    """Device d's (stage, op) sequence for n >= 2P-1 micro-batches."""
    fwd, bwd, wgt = Op.FORWARD, Op.BACKWARD, Op.WEIGHT
    down, up = d, 2 * P - 1 - d
    order = [(down, fwd)] * (2 * (P - d) - 1)  # the first stage runs ahead
    order += [(up, fwd), (down, fwd)] * d
    order += [(up, fwd), (up, bwd), (up, wgt)] * (P - d)
    for k in range(n - P):  # steady state: the first stage's forwards end 2P-1-d early
        if k < n - (2 * P - 1 - d):
            order.append((down, fwd))
        order += [(down, bwd), (down, wgt), (up, fwd), (up, bwd), (up, wgt)]
    order += [(down, bwd), (up, bwd)] * d  # cool-down: the gradient chain first
    order += [(down, bwd), (down, wgt)] * (P - d)
    return order + [(up, wgt)] * d + [(down, wgt)] * d
