"""Point-to-point activation and gradient channels between neighbouring stages.

Receives are posted ahead of need (a bounded window), so a stage can ask whether a
gradient has already arrived without blocking: that is what Varuna's opportunistic
deviation needs. Messages are matched by tag (2i for the activation of micro-batch i,
2i+1 for its gradient); both directions carry micro-batches in increasing order, so
the order also matches on backends that ignore tags (NCCL).
"""

from __future__ import annotations

from collections import deque

import torch
import torch.distributed as dist

_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64]


def send_meta(t: torch.Tensor, dst: int) -> None:
    """Blocking send of a tensor's shape and dtype (startup shape propagation)."""
    meta = torch.zeros(8, dtype=torch.int64)
    meta[0], meta[1] = t.dim(), _DTYPES.index(t.dtype)
    meta[2 : 2 + t.dim()] = torch.tensor(t.shape)
    dist.send(meta, dst)


def recv_meta(src: int) -> tuple[tuple[int, ...], torch.dtype]:
    """Counterpart of :func:`send_meta`."""
    meta = torch.zeros(8, dtype=torch.int64)
    dist.recv(meta, src)
    ndim = int(meta[0])
    return tuple(int(x) for x in meta[2 : 2 + ndim]), _DTYPES[int(meta[1])]


class Inbox:
    """Pre-posted receives of one kind (activations or gradients) from one peer."""

    def __init__(self, peer: int, shape, dtype, device, parity: int, order: list[int], window: int):
        self.peer, self.shape, self.dtype, self.device = peer, shape, dtype, device
        self.parity = parity
        self.todo = deque(order)
        self.window = max(1, window)
        self.posted: dict[int, tuple[torch.Tensor, object]] = {}
        self._fill()

    def _fill(self) -> None:
        while self.todo and len(self.posted) < self.window:
            i = self.todo.popleft()
            buf = torch.empty(self.shape, dtype=self.dtype, device=self.device)
            self.posted[i] = (buf, dist.irecv(buf, self.peer, tag=2 * i + self.parity))

    def ready(self, i: int) -> bool:
        """Has micro-batch ``i`` arrived (never blocks)?"""
        entry = self.posted.get(i)
        return entry is not None and entry[1].is_completed()

    def take(self, i: int) -> torch.Tensor:
        """Wait for micro-batch ``i`` and return it."""
        if i not in self.posted:
            raise RuntimeError(
                f"micro-batch {i} received out of order (posted: {list(self.posted)})"
            )
        buf, work = self.posted.pop(i)
        work.wait()
        self._fill()
        return buf


class Outbox:
    """Asynchronous sends to one peer; completed sends are released as we go."""

    def __init__(self, peer: int, parity: int, max_inflight: int = 8):
        self.peer, self.parity, self.max_inflight = peer, parity, max_inflight
        self.inflight: deque = deque()

    def send(self, i: int, t: torch.Tensor) -> None:
        t = t.contiguous()
        self.inflight.append((t, dist.isend(t, self.peer, tag=2 * i + self.parity)))
        while self.inflight and (
            self.inflight[0][1].is_completed() or len(self.inflight) > self.max_inflight
        ):
            self.inflight.popleft()[1].wait()

    def drain(self) -> None:
        while self.inflight:
            self.inflight.popleft()[1].wait()
