"""Mobius's planning half (Feng et al., ASPLOS '23, sec. 3.2-3.3): spec to Plan.

* ``costs``: per-layer costs with what the runtime adds (update on upload, store back,
  input reloads, gradients down, recompute) and a partition's step time.
* ``partition``: the sec. 3.2 MIP (HiGHS via scipy), at a given S or the best.
* ``cross_mapping``: sec. 3.3, stages to devices by PCIe root complex.
* ``plan``: a ``schedule: mobius`` job as a Plan with its ``mobius`` record; a re-cut
  of its stages (rebalancing) and their memory rule.
* ``simulator``: one simulated step, compute and swaps rank by rank, root complexes
  sharing their bandwidth.
* ``step``: a plan's stages priced and its step simulated; why Mobius; ``auto``'s
  choice of it (where no P x D layout fits, or where it is simulated faster).
* ``system``: the entry ``core.systems`` registers for ``schedule: mobius``, the one
  way the planner's resolver reaches this room.

Part of ``mobius`` (layer 4 of ``engine.LAYERS``): it imports planner, calibration,
model and core below it, and none of the swapping runtime.
"""
