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
"""

from __future__ import annotations

from functools import lru_cache

from jobctl.engine.core.actions import Action, B, F, R, W


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
