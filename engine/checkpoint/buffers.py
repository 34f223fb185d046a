"""Host buffers a checkpoint's snapshot copies into, reused from one checkpoint to the next.

The snapshot is the only part of a checkpoint training waits for. Copying a rank's
state into freshly allocated tensors costs mostly the allocation: the kernel maps
and zeroes every new page (at 327 MiB of GPT state on this machine, 117 ms of CPU
against 18 ms for the same copy into tensors already mapped; ``python -m benchmarks
run checkpoint_profile``). So a snapshot copies into a :class:`Buffers` set, one host
tensor per (block, parameter, state key), allocated on first use (pinned on CUDA,
where it also makes the device-to-host copy a DMA), and the checkpoint manager hands
the set back to its :class:`BufferPool` once the background writer has written it, or
once a newer checkpoint replaced it before it was written (coalescing). A new set is
made only when none is idle, so at most three live at once (written, waiting, being
filled: as many as the snapshots alive before), and the pool keeps one idle set: the
price is one host copy of the rank's state held between checkpoints. A run whose
writer keeps up (the usual case) refills that one set every time.
"""

from __future__ import annotations

import threading

import torch

Key = tuple  # (block, parameter name, "param" | "mask" | optimizer state key)


class Buffers:
    """One snapshot's host tensors, by key; refilled in place by the next snapshot."""

    def __init__(self) -> None:
        self.tensors: dict[Key, torch.Tensor] = {}

    def copy(self, key: Key, value: torch.Tensor) -> torch.Tensor:
        """A host copy of ``value`` in this set's tensor for ``key`` (made to fit)."""
        value = value.detach()
        buf = self.tensors.get(key)
        if buf is None or buf.shape != value.shape or buf.dtype != value.dtype:
            pin = value.is_cuda and torch.cuda.is_available()
            buf = torch.empty(value.shape, dtype=value.dtype, pin_memory=pin)
            self.tensors[key] = buf
        buf.copy_(value)
        return buf


class Scoped:
    """A :class:`Buffers` set seen under a key prefix, so several copies of the same
    blocks (AvgPipe's reference and parallel models) fill one set side by side."""

    def __init__(self, buffers: Buffers, prefix: object):
        self.buffers, self.prefix = buffers, prefix

    def copy(self, key: Key, value: torch.Tensor) -> torch.Tensor:
        return self.buffers.copy((self.prefix, *key), value)


class BufferPool:
    """Idle :class:`Buffers` sets, at most ``keep`` of them (thread-safe: the writer
    gives back what the training thread takes)."""

    def __init__(self, keep: int = 1):
        self.keep = keep
        self._idle: list[Buffers] = []
        self._lock = threading.Lock()

    def take(self) -> Buffers:
        """An idle set, or a new one."""
        with self._lock:
            return self._idle.pop() if self._idle else Buffers()

    def give(self, buffers: Buffers | None) -> None:
        """``buffers`` is written (or dropped): the next snapshot may refill it."""
        with self._lock:
            if buffers is not None and len(self._idle) < self.keep:
                self._idle.append(buffers)
