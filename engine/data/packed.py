"""Sequences packed from a stream of token ids, in the order ``order.SampleOrder`` draws.

Sequence ``k`` is ids ``[k*L, k*L + L + 1)`` of the stream (``L = seq_len``: the inputs
and, shifted by one, the targets), so the stream holds ``(n - 1) // L`` sequences. A
held-out fraction for evaluation is the last sequences of the stream; training
orders the rest. Each ``batch`` may append what it read (global index, sequence id) to
the trace file that ``JOBCTL_DATA_TRACE`` names.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from jobctl.engine.core import env
from jobctl.engine.data.order import SampleOrder
from jobctl.engine.data.tokens import sequences_in


class Split:
    """Sequences ``[first, first + size)`` of a stream of ids ``stream``."""

    def __init__(self, stream, seq_len: int, first: int = 0, size: int | None = None):
        self.stream, self.seq_len, self.first = stream, seq_len, first
        self.size = size if size is not None else sequences_in(len(stream), seq_len) - first


def split(stream, seq_len: int, eval_fraction: float | None) -> tuple[Split, Split | None]:
    """The training split and the held-out tail (``eval_fraction`` of the sequences)."""
    total = sequences_in(len(stream), seq_len)
    if not eval_fraction:
        return Split(stream, seq_len, 0, total), None
    held = max(1, round(total * eval_fraction))
    return Split(stream, seq_len, 0, total - held), Split(stream, seq_len, total - held, held)


class PackedData:
    """``(inputs, targets)`` of any global sample index, over one split.

    ``part`` may be a function that opens the split: it runs on first use, so pipeline
    stages that never read tokens (the middle ones) never open the file or tokenize
    the dataset.
    """

    def __init__(
        self,
        part: Split | Callable[[], Split],
        seed: int = 0,
        shuffle: bool = True,
        traced: bool = True,
        remote: bool | None = None,
    ):
        self._part, self._open = (part, None) if isinstance(part, Split) else (None, part)
        self.seed, self.shuffle = seed, shuffle
        self._order: SampleOrder | None = None
        self._lock = threading.Lock()  # the training thread and a read-ahead thread
        self._remote = remote
        folder = os.environ.get(env.DATA_TRACE)
        self.trace = Path(folder) / f"{os.getpid()}.txt" if folder and traced else None

    @property
    def part(self) -> Split:
        """The split, opened on first use."""
        with self._lock:
            if self._part is None:
                self._part = self._open()
        return self._part

    @property
    def order(self) -> SampleOrder:
        if self._order is None:
            self._order = SampleOrder(self.part.size, self.seed, self.shuffle)
        return self._order

    @property
    def seq_len(self) -> int:
        return self.part.seq_len

    @property
    def size(self) -> int:
        """Sequences per epoch."""
        return self.part.size

    @property
    def remote(self) -> bool:
        """Read over the network (each sequence a ranged request)?"""
        if self._remote is None:
            self._remote = getattr(self.part.stream, "fs", None) is not None
        return self._remote

    def epoch(self, index: int) -> int:
        """The epoch of global sample ``index``."""
        return self.order.epoch(index)

    def batch(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of global samples ``[start, start + count)``."""
        got = self.read(start, count)
        self.record(start, count)
        return got

    def read(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch`` without the trace (what a read-ahead does before it is used)."""
        ids = [self.order.sequence(start + k) for k in range(count)]
        L, first = self.seq_len, self.part.first
        spans = [((first + k) * L, (first + k) * L + L + 1) for k in ids]
        seqs = torch.from_numpy(np.stack(_read(self.part.stream, spans)).astype(np.int64))
        return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()

    def record(self, start: int, count: int) -> None:
        """Append ``index sequence`` lines of the samples used to the trace, if any."""
        if self.trace is not None:
            with open(self.trace, "a") as f:
                f.writelines(f"{i} {self.order.sequence(i)}\n" for i in range(start, start + count))


def _read(stream, spans: list[tuple[int, int]]) -> list[np.ndarray]:
    if hasattr(stream, "read_many"):  # a TokenFile: one concurrent fetch when remote
        return stream.read_many(spans)
    return [np.asarray(stream[a:b]) for a, b in spans]
