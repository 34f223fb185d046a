"""Fail-stutter detection (Varuna sec. 4.6): a device persistently slower than its peers.

Data-parallel replicas of one stage run the same computation, so their per-micro-batch
compute times should match. Each heartbeat carries a rank's mean forward+backward
compute time per micro-batch for one step (``fwd_ms`` + ``bwd_ms``, and their sum in
seconds as ``compute_s``; ``per_micro_batch_s`` reads either); a rank whose time
exceeds the median of its stage peers by more than ``threshold``, and by at least
``min_excess_s`` (about one CPU scheduling slice: a sub-millisecond stage that ran 0.7 ms
late behind a descheduled peer is noise, not a slow device), in at least
``persistence`` of the last ``window`` steps is a straggler. It stays one until it is
slow in at most ``1 - persistence`` of a window (hysteresis): on busy shared cores a
straggler's peers have slow steps too, and a flag that flickers would let the next
morph keep the slow node it was meant to leave out.
"""

from __future__ import annotations

import statistics
from collections import defaultdict, deque
from dataclasses import dataclass, field


def per_micro_batch_s(heartbeat: dict) -> float:
    """A heartbeat's forward+backward compute seconds per micro-batch (older workers
    sent only ``compute_s``)."""
    if "fwd_ms" in heartbeat and "bwd_ms" in heartbeat:
        return (heartbeat["fwd_ms"] + heartbeat["bwd_ms"]) / 1e3
    return heartbeat["compute_s"]


@dataclass
class StragglerDetector:
    """Keeps recent per-rank compute times and flags persistent outliers."""

    threshold: float = 0.15
    window: int = 10
    persistence: float = 0.7
    min_excess_s: float = 0.002
    _times: dict[int, dict[int, float]] = field(default_factory=lambda: defaultdict(dict))
    _stage_of: dict[int, int] = field(default_factory=dict)
    _node_of: dict[int, int] = field(default_factory=dict)
    _slow: dict[int, deque] = field(default_factory=dict)
    _flagged: set[int] = field(default_factory=set)

    def observe(self, step: int, rank: int, stage: int, node: int, compute_s: float) -> None:
        """Record one rank's per-micro-batch compute time at ``step``."""
        self._times[step][rank] = compute_s
        self._stage_of[rank], self._node_of[rank] = stage, node

    def close_step(self, step: int) -> None:
        """Judge ``step`` once all its heartbeats are in (call with the step number)."""
        times = self._times.pop(step, {})
        by_stage: dict[int, list[int]] = defaultdict(list)
        for rank in times:
            by_stage[self._stage_of[rank]].append(rank)
        for ranks in by_stage.values():
            if len(ranks) < 2:
                continue  # no peer to compare with
            for rank in ranks:
                peer = statistics.median(times[r] for r in ranks if r != rank)
                slow = times[rank] > max((1 + self.threshold) * peer, peer + self.min_excess_s)
                hist = self._slow.setdefault(rank, deque(maxlen=self.window))
                hist.append(slow)
                if len(hist) < self.window:
                    continue
                if sum(hist) >= self.persistence * self.window:
                    self._flagged.add(rank)
                elif sum(hist) <= (1 - self.persistence) * self.window:
                    self._flagged.discard(rank)

    def stragglers(self) -> list[int]:
        """Ranks slow in at least ``persistence`` of a full window of steps (and not
        mostly fast since)."""
        return sorted(self._flagged)

    def nodes(self, ranks: list[int]) -> list[int]:
        """The nodes hosting ``ranks``."""
        return sorted({self._node_of[r] for r in ranks})
