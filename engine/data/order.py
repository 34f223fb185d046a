"""The order samples are trained in: a seeded shuffle per epoch over a global index.

Global sample ``i`` is sequence ``perm_e[i mod N]`` of epoch ``e = i div N``, where
``perm_e`` is a permutation of the ``N`` sequences drawn from ``(seed, e)`` alone. The
order is a pure function of the index, so any P x D, any morph and any resume that
starts at index ``step * B`` continues at exactly the sample an uninterrupted run
would read next.
"""

from __future__ import annotations

import numpy as np


class SampleOrder:
    """Global sample index -> (epoch, sequence id) for ``size`` sequences."""

    def __init__(self, size: int, seed: int = 0, shuffle: bool = True):
        if size < 1:
            raise ValueError("no sequences to order")
        self.size, self.seed, self.shuffle = size, seed, shuffle
        self._perms: dict[int, np.ndarray] = {}

    def epoch(self, index: int) -> int:
        """The epoch global sample ``index`` belongs to (0-based)."""
        return index // self.size

    def sequence(self, index: int) -> int:
        """The sequence id global sample ``index`` reads."""
        epoch, within = divmod(index, self.size)
        if not self.shuffle:
            return within
        return int(self._perm(epoch)[within])

    def _perm(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            rng = np.random.Generator(np.random.PCG64([self.seed, epoch]))
            perm = rng.permutation(self.size)
            # a step's samples span at most two epochs: keep this one and the last
            self._perms = {k: v for k, v in self._perms.items() if k == epoch - 1}
            self._perms[epoch] = perm
        return perm
