"""AvgPipe's planning half (sec. 5.2): what the N parallel models cost a plan, and the
(M, N) prediction its tuner picks from.

* ``costs``: a stage's memory with the other N - 1 parallel models, the reference and
  the N local updates (F_mod); a step's calibration with the optimizer step N times;
  what a memory refusal adds.
* ``strategy``: the entry ``core.systems`` registers for ``parallelism.averaging:
  elastic`` (``UpdateStrategy``), the one way the planner's search reaches this room.
* ``tuning``: eqs. 1-8, every (M, N) predicted from one profiled setting, and the
  fastest that fits the memory cap picked (``averaging.tuning`` profiles and resolves
  ``auto`` with it; ``views.averaging_tuning`` renders it).

Part of ``averaging`` (layer 5 of ``engine.LAYERS``): it imports planner and calibration
below it, and none of the averaging runtime.
"""
