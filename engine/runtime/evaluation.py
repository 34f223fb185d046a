"""The eval loss: one global batch of the validation split, forward only.

Every stage runs the forwards of its action list (no backward, no update) on the
validation samples ``[0, B)`` in file order, through the same pipeline channels as
training, so any P x D gives the same number. The last stage's micro-batch losses,
each weighted ``m / B``, sum over the replicas to the batch mean. A rank hosting two
stages (ZB-V) runs both stages' forwards of its device list.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from jobctl.engine.core.actions import Op
from jobctl.engine.data.dataset import Samples
from jobctl.engine.runtime.executor import StepExecutor
from jobctl.engine.runtime.hook import StageState
from jobctl.engine.runtime.p2p.gloo import comm_device


def eval_loss(ex: StepExecutor, state: StageState, data: Samples) -> float | None:
    """The validation batch's mean loss on last-stage ranks (None elsewhere). ``ex`` may
    run two stages (a ZB-V rank's ``TwoStageExecutor``, ``by_stage``): each reads the
    validation split, and the one that is the pipeline's last holds the losses."""
    parts = list(getattr(ex, "by_stage", {0: ex}).values())
    forwards = [a for a in state.actions if getattr(a, "action", a).op is Op.FORWARD]
    train_data = [p.data for p in parts]
    for p in parts:
        p.data = data
    state.stage.eval()
    try:
        with torch.no_grad():
            ex.run(forwards, step=0)
    finally:
        for p, kept in zip(parts, train_data, strict=True):
            p.data = kept
        state.stage.train()
    last = [p for p in parts if p.topo.is_last]
    saved = last[0].saved if last else {}
    for p in parts:
        p.saved = {}
    if not last:
        return None
    total = sum(float(s["loss"]) for s in saved.values())
    out = torch.tensor([total], dtype=torch.float64, device=comm_device())
    if last[0].topo.dp_group is not None:
        dist.all_reduce(out, group=last[0].topo.dp_group)
    return float(out)
