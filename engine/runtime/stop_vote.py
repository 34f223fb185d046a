"""The stop vote: do all training ranks stop after this step? (SIGTERM, ``jobctl
stop``), agreed one step behind so no rank waits for it between steps."""

from __future__ import annotations

import torch
import torch.distributed as dist

from jobctl.engine.runtime.p2p.gloo import comm_device


class StopVote:
    """Do all ranks stop? Agreed one step behind, off the critical path.

    A rank asked to stop (SIGTERM, ``jobctl stop``) votes at the end of a step; the vote
    (an asynchronous MAX all-reduce over the training ranks) runs while the next step
    trains, and its result is read after that step. Every rank reads the same result
    after the same step, so all checkpoint the same step, one step after the request,
    and no rank waits for the others between steps (a blocking vote after every step
    made each rank wait for the pipeline's slowest rank there).
    """

    def __init__(self) -> None:
        self.flag: torch.Tensor | None = None
        self.work = None

    def start(self, want: bool, group=None) -> None:
        self.flag = torch.tensor([1 if want else 0], dtype=torch.int32, device=comm_device())
        self.work = dist.all_reduce(self.flag, op=dist.ReduceOp.MAX, group=group, async_op=True)

    def result(self) -> bool:
        """The vote started after the previous step (False if none was)."""
        if self.work is None:
            return False
        self.work.wait()
        self.work = None
        return bool(self.flag.item())
