"""Sequences packed from a stream of token ids, in the order ``order.SampleOrder`` draws.

Sequence ``k`` is ids ``[k*L, k*L + L + 1)`` of the stream (``L = seq_len``: the inputs
and, shifted by one, the targets), so the stream holds ``(n - 1) // L`` sequences. A
held-out fraction for evaluation is the last sequences of the stream; training
orders the rest. The order is block-structured (``order``): a block is ``block_mb`` MB of
consecutive sequences, so a remote token file is read a whole block per ranged GET
(``BlockReader``: a small LRU cache of blocks, the next shuffle window read ahead in
the background from the middle of the current one) instead of one request per
sequence; a local file (memory-mapped) or a tokenized dataset (in memory) is sliced
per sequence. Each ``batch`` may append what it read (global index, sequence id) to
the trace file that ``JOBCTL_DATA_TRACE`` names.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from jobctl.engine.core import env
from jobctl.engine.data.order import SampleOrder
from jobctl.engine.data.tokens import sequences_in

BLOCK_MB = 4.0  # one ranged GET of a few MB: the request cost is small next to the transfer
WINDOW = 4  # blocks whose sequences are shuffled together


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
        block_mb: float = BLOCK_MB,
        window: int = WINDOW,
    ):
        self._part, self._open = (part, None) if isinstance(part, Split) else (None, part)
        self.seed, self.shuffle = seed, shuffle
        self._order: SampleOrder | None = None
        self._lock = threading.Lock()  # the training thread and a read-ahead thread
        self._remote = remote
        self.block_mb, self.window = block_mb, window
        self._blocks: BlockReader | None = None
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
            part = self.part
            width = part.seq_len * np.dtype(getattr(part.stream, "dtype", np.uint16)).itemsize
            block = max(1, int(self.block_mb * 2**20) // width)
            self._order = SampleOrder(part.size, self.seed, self.shuffle, block, self.window)
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
        """Read over the network (each block a ranged request)?"""
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
        indices = range(start, start + count)
        seqs = torch.from_numpy(np.stack(self._sequences(indices)).astype(np.int64))
        return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()

    def _sequences(self, indices: range) -> list[np.ndarray]:
        part = self.part
        if getattr(part.stream, "fs", None) is not None:  # a remote token file
            order = self.order
            with self._lock:
                if self._blocks is None:
                    self._blocks = BlockReader(part, order)
            return self._blocks.sequences(indices)
        L, first = part.seq_len, part.first
        ids = [self.order.sequence(i) for i in indices]
        spans = [((first + k) * L, (first + k) * L + L + 1) for k in ids]
        return _read(part.stream, spans)

    def close(self, wait: bool = False) -> None:
        """Stop reading blocks ahead (``wait``: finish every block already queued)."""
        if self._blocks is not None:
            self._blocks.close(wait)

    def record(self, start: int, count: int) -> None:
        """Append ``index sequence`` lines of the samples used to the trace, if any."""
        if self.trace is not None:
            with open(self.trace, "a") as f:
                f.writelines(f"{i} {self.order.sequence(i)}\n" for i in range(start, start + count))


def _read(stream, spans: list[tuple[int, int]]) -> list[np.ndarray]:
    if hasattr(stream, "read_many"):  # a local TokenFile (remote ones go by BlockReader)
        return stream.read_many(spans)
    return [np.asarray(stream[a:b]) for a, b in spans]


class BlockReader:
    """Sequences of a remote split read a whole block per ranged GET, blocks kept in an
    LRU cache of ``3 * window`` (the window being read, the next one, one spare); a
    read past the middle of a window queues the next window's blocks on background
    threads."""

    def __init__(self, part: Split, order: SampleOrder):
        self.part, self.order = part, order
        self.keep = 3 * order.window
        self.pool = ThreadPoolExecutor(order.window, thread_name_prefix="jobctl-blocks")
        self.cache: OrderedDict[int, Future] = OrderedDict()
        self.lock = threading.Lock()
        self.ahead: set[tuple[int, int]] = set()  # windows already queued

    def sequences(self, indices: range) -> list[np.ndarray]:
        """Ids ``[k*L, k*L + L + 1)`` of the sequence ``k`` each global index reads."""
        where = [self.order.block_of(self.order.sequence(i)) for i in indices]
        wanted = dict.fromkeys(block for block, _ in where)
        blocks = {block: self._block(block) for block in wanted}  # all on the wire at once
        self._read_ahead(indices[-1])
        L = self.part.seq_len
        return [blocks[block].result()[at * L : at * L + L + 1] for block, at in where]

    def _read_ahead(self, index: int) -> None:
        """Queue the next window once half of this one is read: early enough to hide
        its GETs, late enough not to spend the bandwidth and memory before it counts."""
        epoch, k = self.order.window_of(index)
        start, stop = self.order.window_span(epoch, k)
        if index % self.order.size - start < (stop - start) // 2:
            return
        nxt = self.order.next_window(epoch, k)
        with self.lock:
            if nxt in self.ahead:
                return
            self.ahead = {w for w in self.ahead if w[0] >= epoch - 1} | {nxt}
        for block in self.order.window_blocks(*nxt):
            self._block(block)

    def _block(self, block: int) -> Future:
        with self.lock:
            future = self.cache.get(block)
            if future is None or _failed(future):  # a failed GET is retried, not cached
                future = self.pool.submit(self._fetch, block)
            self.cache[block] = future
            self.cache.move_to_end(block)
            while len(self.cache) > self.keep:
                self.cache.popitem(last=False)
        return future

    def _fetch(self, block: int) -> np.ndarray:
        """Ids of the block's sequences and the one target id after them: one request."""
        a, b = self.order.block_span(block)
        L, first = self.part.seq_len, self.part.first
        return self.part.stream.read((first + a) * L, (first + b) * L + 1)

    def close(self, wait: bool = False) -> None:
        self.pool.shutdown(wait=wait, cancel_futures=not wait)


def _failed(future: Future) -> bool:
    return future.done() and not future.cancelled() and future.exception() is not None
