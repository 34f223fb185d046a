"""The eval loss: one global batch of the validation split, forward only.

Every stage runs the forwards of its action list (no backward, no update) on the
validation samples ``[0, B)`` in file order, through the same pipeline channels as
training, so any P x D gives the same number. The last stage's micro-batch losses,
each weighted ``m / B``, sum over the replicas to the batch mean.
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
    """The validation batch's mean loss on last-stage ranks (None elsewhere)."""
    forwards = [a for a in state.actions if a.op is Op.FORWARD]
    train_data, ex.data = ex.data, data
    state.stage.eval()
    try:
        with torch.no_grad():
            ex.run(forwards, step=0)
    finally:
        ex.data = train_data
        state.stage.train()
    saved, ex.saved = ex.saved, {}
    if not state.topo.is_last:
        return None
    total = sum(float(s["loss"]) for s in saved.values())
    out = torch.tensor([total], dtype=torch.float64, device=comm_device())
    if state.topo.dp_group is not None:
        dist.all_reduce(out, group=state.topo.dp_group)
    return float(out)
