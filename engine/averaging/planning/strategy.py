"""AvgPipe's elastic averaging as an update strategy: the entry ``core.systems`` loads
for ``parallelism.averaging: elastic``.

``core.systems.UPDATES`` names this module, and the planner's search reaches AvgPipe
only through it (``core.systems.UpdateStrategy`` is what it offers): ``calibration``
prices a step with each block's optimizer step N times, ``memory`` adds the other
N - 1 parallel models, the reference and the N local updates to each stage's bytes,
``refusal_note`` says so in a memory refusal (all three in ``costs``); ``NAME`` is its
line.
"""

from __future__ import annotations

from jobctl.engine.averaging.planning.costs import calibration, memory, refusal_note

__all__ = ["NAME", "calibration", "memory", "refusal_note"]

NAME = "AvgPipe's elastic averaging"
