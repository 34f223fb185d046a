"""The order samples are trained in: a seeded block-structured shuffle per epoch.

The ``N`` sequences are cut into blocks of ``block`` consecutive sequences (the last
may be shorter; a block is a few MB of the file, so a remote reader fetches one with a
single ranged GET). Epoch ``e`` visits the blocks in a permutation drawn from
``(seed, e)``; consecutive runs of ``window`` blocks of that permutation form shuffle
windows, and the sequences of window ``k`` are visited in a permutation drawn from
``(seed, e, k)``. Global sample ``i`` is position ``i mod N`` of epoch ``i div N``, so
each epoch reads every sequence once, and the order is a pure function of ``(seed,
epoch, index)``: any P x D, any morph and any resume that starts at index ``step * B``
continues at exactly the sample an uninterrupted run would read next. ``block=1,
window=1`` is a plain shuffle of single sequences; unshuffled, sequence ``i mod N``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

KEEP_WINDOWS = 4  # cached window orders: a step's samples span at most two epochs


@dataclass(frozen=True)
class Layout:
    """One epoch's block permutation and where each window ends (in positions)."""

    blocks: np.ndarray
    ends: np.ndarray


class SampleOrder:
    """Global sample index -> (epoch, sequence id) for ``size`` sequences."""

    def __init__(
        self, size: int, seed: int = 0, shuffle: bool = True, block: int = 1, window: int = 1
    ):
        if size < 1:
            raise ValueError("no sequences to order")
        if block < 1 or window < 1:
            raise ValueError(f"block ({block}) and window ({window}) must be at least 1")
        self.size, self.seed, self.shuffle = size, seed, shuffle
        self.block, self.window = block, window
        self.count = -(-size // block)  # blocks, the last maybe short
        self._layouts: dict[int, Layout] = {}
        self._windows: dict[tuple[int, int], np.ndarray] = {}
        self._lock = threading.RLock()  # the training thread and read-ahead threads

    def epoch(self, index: int) -> int:
        """The epoch global sample ``index`` belongs to (0-based)."""
        return index // self.size

    def sequence(self, index: int) -> int:
        """The sequence id global sample ``index`` reads."""
        epoch, within = divmod(index, self.size)
        if not self.shuffle:
            return within
        k = self._window_at(epoch, within)
        start = int(self._layout(epoch).ends[k - 1]) if k else 0
        return int(self._sequences(epoch, k)[within - start])

    def block_of(self, sequence: int) -> tuple[int, int]:
        """(block id, position in the block) of ``sequence``."""
        return divmod(sequence, self.block)

    def block_span(self, block: int) -> tuple[int, int]:
        """Sequences ``[first, stop)`` of ``block``."""
        first = block * self.block
        return first, min(self.size, first + self.block)

    def window_of(self, index: int) -> tuple[int, int]:
        """(epoch, window) global sample ``index`` lies in."""
        epoch, within = divmod(index, self.size)
        return epoch, self._window_at(epoch, within)

    def window_span(self, epoch: int, k: int) -> tuple[int, int]:
        """Positions ``[start, stop)`` within ``epoch`` that window ``k`` covers."""
        ends = self._layout(epoch).ends
        return (int(ends[k - 1]) if k else 0), int(ends[k])

    def next_window(self, epoch: int, k: int) -> tuple[int, int]:
        """The window read after window ``k`` of ``epoch``."""
        return (epoch, k + 1) if k + 1 < len(self._layout(epoch).ends) else (epoch + 1, 0)

    def window_blocks(self, epoch: int, k: int) -> list[int]:
        """Block ids of window ``k`` of ``epoch``, in visiting order."""
        blocks = self._layout(epoch).blocks
        return [int(b) for b in blocks[k * self.window : (k + 1) * self.window]]

    def _window_at(self, epoch: int, within: int) -> int:
        return int(np.searchsorted(self._layout(epoch).ends, within, side="right"))

    def _layout(self, epoch: int) -> Layout:
        got = self._layouts.get(epoch)
        if got is None:
            with self._lock:
                got = self._new_layout(epoch)
        return got

    def _new_layout(self, epoch: int) -> Layout:
        got = self._layouts.get(epoch)
        if got is None:
            if self.shuffle:
                rng = np.random.Generator(np.random.PCG64([self.seed, epoch, 0]))
                blocks = rng.permutation(self.count)
            else:
                blocks = np.arange(self.count)
            sizes = np.full(self.count, self.block, dtype=np.int64)
            sizes[-1] = self.size - (self.count - 1) * self.block
            ends = np.cumsum(np.add.reduceat(sizes[blocks], np.arange(0, self.count, self.window)))
            got = Layout(blocks, ends)
            # a step's samples span at most two epochs: keep this one and the last
            self._layouts = {k: v for k, v in self._layouts.items() if k == epoch - 1}
            self._layouts[epoch] = got
        return got

    def _sequences(self, epoch: int, k: int) -> np.ndarray:
        """The sequence ids of window ``k`` of ``epoch`` in the order they are read."""
        got = self._windows.get((epoch, k))
        if got is None:
            with self._lock:
                got = self._new_window(epoch, k)
        return got

    def _new_window(self, epoch: int, k: int) -> np.ndarray:
        got = self._windows.get((epoch, k))
        if got is None:
            spans = [self.block_span(b) for b in self.window_blocks(epoch, k)]
            ids = np.concatenate([np.arange(a, b) for a, b in spans])
            rng = np.random.Generator(np.random.PCG64([self.seed, epoch, 1, k]))
            got = ids[rng.permutation(len(ids))]
            if len(self._windows) >= KEEP_WINDOWS:
                self._windows.pop(next(iter(self._windows)), None)
            self._windows[(epoch, k)] = got
        return got
