"""The CUDA tier: stage records in pinned host memory, moved on a copy stream.

Pinned (page-locked) host memory lets ``copy_(non_blocking=True)`` run as a DMA on
a side stream while the compute stream trains the current stage; the stream is
created with the highest priority (Mobius sec. 3.3: the prefetch of the stage that
runs first goes first). A handle records an event on the copy stream; ``result()``
makes the compute stream wait for it. Same interface and ``Traffic`` counting as
``tier.FileTier``; tested only where a GPU is present.
"""

from __future__ import annotations

import torch

from jobctl.engine.mobius.layout import StageLayout
from jobctl.engine.mobius.tier import Ranges, Traffic


class _Event:
    """A copy that completes on the copy stream; ``result()`` orders compute after it."""

    def __init__(self, stream: torch.cuda.Stream, value=None):
        self.event = torch.cuda.Event()
        self.event.record(stream)
        self.value = value

    def result(self):
        torch.cuda.current_stream().wait_event(self.event)
        return self.value


class _Later:
    """``fn`` run by the first ``result()``, on the compute stream (after the copies
    it waits for)."""

    def __init__(self, fn):
        self.fn, self.done, self.value = fn, False, None

    def result(self):
        if not self.done:
            self.value, self.done = self.fn(), True
        return self.value


class PinnedTier:
    """Stage records and offloaded activations in pinned host memory."""

    def __init__(self, device: torch.device):
        self.device = device
        self.traffic = Traffic()
        low, high = torch.cuda.Stream.priority_range()
        self.stream = torch.cuda.Stream(device=device, priority=high if high < low else low)
        self.records: dict[int, torch.Tensor] = {}
        self.acts: dict[tuple[int, int], torch.Tensor] = {}

    def add(self, j: int, lay: StageLayout) -> None:
        """Stage ``j``'s record, zeroed."""
        self.records[j] = torch.zeros(lay.nbytes // 4, pin_memory=True)

    def close(self) -> None:
        self.stream.synchronize()

    def after(self, fn) -> _Later:
        """``fn`` (a stage's optimizer update) runs on the device when first awaited."""
        return _Later(fn)

    def drain(self) -> None:
        """Wait until every copy issued so far has finished."""
        self.stream.synchronize()

    def _copy(self, dst: torch.Tensor, src: torch.Tensor, ranges: Ranges, kinds, way: str):
        self.stream.wait_stream(torch.cuda.current_stream())  # src is computed
        with torch.cuda.stream(self.stream):
            for (start, length), kind in zip(ranges, kinds, strict=True):
                a, n = start // 4, length // 4
                dst[a : a + n].copy_(src[a : a + n], non_blocking=True)
                self.traffic.add(kind, way, length)
        return _Event(self.stream)

    def load(self, j: int, dst: torch.Tensor, ranges: Ranges, kind: list[str]) -> _Event:
        return self._copy(dst, self.records[j], ranges, kind, "up")

    def store(self, j: int, src: torch.Tensor, ranges: Ranges, kind: list[str]) -> _Event:
        return self._copy(self.records[j], src, ranges, kind, "down")

    def put_act(self, key: tuple[int, int], t: torch.Tensor) -> _Event:
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            host.copy_(t.detach(), non_blocking=True)
            t.record_stream(self.stream)  # not reused before the copy has read it
        self.acts[key] = host
        self.traffic.add("acts", "down", host.numel() * host.element_size())
        return _Event(self.stream)

    def get_act(self, key: tuple[int, int]) -> _Event:
        host = self.acts.pop(key)
        out = torch.empty(host.shape, dtype=host.dtype, device=self.device)
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            out.copy_(host, non_blocking=True)
        self.traffic.add("acts", "up", host.numel() * host.element_size())
        return _Event(self.stream, out)

    def new_step(self) -> None:
        self.acts.clear()

    def read_span(self, j: int, start: int, out: torch.Tensor) -> None:
        self.stream.synchronize()
        a = start // 4
        out.copy_(self.records[j][a : a + out.numel()].view(out.shape))
        self.traffic.add("ties", "up", out.numel() * 4)

    def write_span(self, j: int, start: int, src: torch.Tensor) -> None:
        self.stream.synchronize()
        a = start // 4
        self.records[j][a : a + src.numel()].copy_(src.reshape(-1))
        self.traffic.add("ties", "down", src.numel() * 4)
