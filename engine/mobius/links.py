"""The boundaries between Mobius stages: activations forward, their gradients back.

Stage j runs on rank ``placement[j]``: by default ``j % N`` (the paper's Figure 4a:
stages 1 and 5 on P1, 2 and 6 on P2, ...), or a cross mapping (sec. 3.3,
``mobius.planning.cross_mapping``) that keeps adjacent stages off one PCIe root complex. A
boundary tensor whose two stages share a rank is handed over in memory; otherwise it
goes over the process group as a small header (dtype, shape) and the tensor, tagged
by (kind, stage, micro-batch). A traced model's carrier holds several values
(``model.graph.boundary``); its layout goes once, before the stage's first input.
Every rank runs its stages in the step's one global order (forwards ascending,
backwards descending) and a receive waits only for a stage earlier in that order,
so any placement is free of deadlock; sends are asynchronous and waited for at the
step's end (``drain``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64)
_KINDS = ("a", "g", "m")  # activations, gradients, a traced carrier's layout (once)
_HEADER = 8  # dtype code, ndim, up to 6 sizes


def round_robin(stages: int, world: int) -> tuple[int, ...]:
    """The rank of each stage when stage j runs on rank ``j % N``."""
    return tuple(j % world for j in range(stages))


class Links:
    """Boundary tensors of one rank's stages, in memory or over ``group``."""

    def __init__(self, rank: int, placement: tuple[int, ...], micro_batches: int, group=None):
        self.rank, self.placement, self.M, self.group = rank, placement, micro_batches, group
        self.local: dict[tuple[str, int, int], torch.Tensor] = {}
        self.sent: list = []  # (work, tensors kept alive until it completes)

    def _tag(self, kind: str, j: int, i: int) -> int:
        return (3 * (j * self.M + i) + _KINDS.index(kind)) % (2**30)

    def send(self, kind: str, j: int, i: int, t: torch.Tensor) -> None:
        """Hand ``t`` (the input of stage ``j``, or the gradient of its output) to the
        rank hosting stage ``j``."""
        dst = self.placement[j]
        if dst == self.rank:
            self.local[(kind, j, i)] = t
            return
        t = t.detach().contiguous()
        head = torch.zeros(_HEADER, dtype=torch.int64)
        head[0], head[1] = _DTYPES.index(t.dtype), t.dim()
        head[2 : 2 + t.dim()] = torch.tensor(t.shape)
        tag = self._tag(kind, j, i)
        for part in (head, t.cpu()):
            self.sent.append((dist.isend(part, self._global(dst), self.group, tag), part))

    def recv(self, kind: str, j: int, i: int, src_stage: int, device) -> torch.Tensor:
        """The tensor ``send`` gave stage ``j`` from stage ``src_stage``."""
        src = self.placement[src_stage]
        if src == self.rank:
            return self.local.pop((kind, j, i))
        head = torch.empty(_HEADER, dtype=torch.int64)
        tag = self._tag(kind, j, i)
        dist.recv(head, self._global(src), self.group, tag)
        shape = tuple(int(s) for s in head[2 : 2 + int(head[1])])
        t = torch.empty(shape, dtype=_DTYPES[int(head[0])])
        dist.recv(t, self._global(src), self.group, tag)
        return t.to(device)

    def _global(self, rank: int) -> int:
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def exchange(self, peer: int, t: torch.Tensor) -> torch.Tensor:
        """Swap ``t`` with rank ``peer``'s tensor of the same shape (a tie's gradient)."""
        other = torch.empty_like(t)
        work = dist.isend(t, self._global(peer), self.group, 2**30)
        dist.recv(other, self._global(peer), self.group, 2**30)
        work.wait()
        return other

    def drain(self) -> None:
        for work, _ in self.sent:
            work.wait()
        self.sent = []
