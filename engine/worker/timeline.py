"""A worker's start-up timeline: wall-clock points printed to its log.

``benchmarks/recovery/recovery_time.py`` reads them (``jobctl-startup WHAT TS`` lines of
``logs/rank-<r>.log``) to split a relaunch into process start, imports, rendezvous,
model build, checkpoint load and first step, beside the supervisor's own events. Wall
clock, not a monotonic one: the points are compared across processes.
"""

from __future__ import annotations

import time

PREFIX = "jobctl-startup"


def mark(what: str, ts: float | None = None) -> None:
    """Print one point (``ts``: when it happened, if not now)."""
    print(f"{PREFIX} {what} {time.time() if ts is None else ts:.3f}", flush=True)


def read_marks(text: str) -> dict[str, float]:
    """The points in a log's ``text``, the last of each name (a log spans attempts)."""
    got = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == PREFIX:
            got[parts[1]] = float(parts[2])
    return got
