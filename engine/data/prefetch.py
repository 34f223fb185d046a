"""Micro-batches read ahead in a background thread, so loading never stalls a step.

A replica reads its micro-batches in a fixed pattern (``Sharding``): micro-batch
``i + 1`` after ``i``, then micro-batch 0 of the next step. After each ``batch`` call
the next ``depth`` micro-batches of that pattern are queued on reader threads (token
files and S3 reads release the GIL); a request that was not predicted (the first, or
after a layout change) is read on the spot, so results never depend on the guess. One
reader two micro-batches ahead serves a local file and a remote one alike: a remote
file's blocks are fetched whole (one ranged GET of a few MB) by
``packed.BlockReader``, the next shuffle window from the middle of the current one,
so a step slices blocks already in memory (more reader threads only contend for the
GIL). On CUDA the read-ahead tensors are pinned, so the copy to the GPU is
asynchronous.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch

from jobctl.engine.data.dataset import Sharding
from jobctl.engine.data.packed import PackedData

Batch = tuple[torch.Tensor, torch.Tensor]


class Prefetcher:
    """``batch(start, count)`` of ``data``, with the next micro-batches read ahead."""

    def __init__(
        self,
        data: PackedData,
        shard: Sharding,
        replica: int,
        pin: bool,
        depth: int = 2,
        readers: int = 1,
    ):
        self.data, self.shard, self.replica = data, shard, replica
        self.pin, self.depth = pin, depth
        self.pool = ThreadPoolExecutor(readers, thread_name_prefix="jobctl-prefetch")
        self.ahead: dict[tuple[int, int], Future] = {}

    def __getattr__(self, name: str):
        return getattr(self.data, name)  # size, epoch, ... of the wrapped source

    def batch(self, start: int, count: int) -> Batch:
        key = (start, count)
        future = self.ahead.pop(key, None)
        got = future.result() if future is not None else self._read(key)
        self.data.record(start, count)  # used now, not when read ahead
        self._queue(start, count)
        return got

    def _read(self, key: tuple[int, int]) -> Batch:
        x, y = self.data.read(*key)
        if self.pin:
            x, y = x.pin_memory(), y.pin_memory()
        return x, y

    def _queue(self, start: int, count: int) -> None:
        """Read the ``depth`` micro-batches after ``start`` in this replica's pattern."""
        step = start // self.shard.global_batch
        here = self._starts(step)
        if count != self.shard.micro_batch or start not in here:
            return  # not one of this replica's micro-batches: no guess
        after = here[here.index(start) + 1 :] + self._starts(step + 1)
        wanted = [(a, count) for a in after[: self.depth]]
        for key in wanted:
            if key not in self.ahead:
                self.ahead[key] = self.pool.submit(self._read, key)
        for stale in [k for k in self.ahead if k not in wanted]:
            self.ahead.pop(stale).cancel()

    def _starts(self, step: int) -> list[int]:
        """First samples of this replica's micro-batches at ``step``, in order."""
        s, r = self.shard, self.replica
        count = s.count(r) if hasattr(s, "count") else s.micro_batches
        return [s.first_sample(step, r, i) for i in range(count)]

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.data.close()


def prefetching(data, shard: Sharding, replica: int, device: torch.device):
    """``data`` read ahead for ``replica``; the synthetic and text sources are computed,
    not read, and stay on the training thread (they would only contend for the GIL)."""
    if not isinstance(data, PackedData):
        return data
    return Prefetcher(data, shard, replica, pin=device.type == "cuda")
