"""Heartbeat timeout: a node whose heartbeats stop while its processes still run is lost.

Varuna's manager (sec. 4.6) detects a preempted VM by missing heartbeats, not only by
processes dying: a machine that vanishes from the network, or hangs, still has a
handle that looks alive. ``HeartbeatWatch`` remembers when each node's last heartbeat
was received (by the supervisor's clock, so worker clocks do not matter) and names the
nodes silent for longer than ``timeout_s``. A node is only watched once it has sent a
heartbeat (start-up, torch import and rendezvous are not counted).

What counts as a sign of life: step heartbeats, and the ``alive`` events each rank's
channel thread sends while it has nothing else to send. The latter matter because in
synchronous training every healthy rank blocks in a collective as soon as one machine
hangs: step heartbeats stop everywhere, but only the hung machine stops pinging.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class HeartbeatWatch:
    """Last heartbeat per node, and which running nodes went silent."""

    def __init__(self, timeout_s: float | None, clock: Callable[[], float] = time.monotonic):
        self.timeout_s, self.clock = timeout_s, clock
        self.last: dict[int, float] = {}

    def saw(self, node: int) -> None:
        self.last[node] = self.clock()

    def silent(self, codes: list[int | None]) -> list[int]:
        """Nodes silent for over ``timeout_s`` whose handle still runs.

        ``codes`` are the backend's exit codes per handle: one per node, or a single
        handle for the whole job (a Slurm batch job), which then stands for every node.
        """
        if self.timeout_s is None:
            return []
        now = self.clock()
        out = []
        for node, at in sorted(self.last.items()):
            code = codes[0] if len(codes) == 1 else codes[node] if node < len(codes) else 0
            if code is None and now - at > self.timeout_s:
                out.append(node)
        return out
