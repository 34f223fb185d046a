"""jobctl.engine.planner.simulator: one simulated training step of a pipeline schedule.

``simulation`` holds the cost model, the result and ``simulate``; ``engine`` is the
hot loop that propagates start times along the schedule's data flow; ``steady``
extrapolates a step of many micro-batches from a few small simulations once the
schedule's periodic steady state is reached; ``devices`` runs a schedule with
several stages per device (ZB-V's per-device lists). Mobius's step (compute and
swaps per rank) is simulated in its own room, ``engine.mobius.planning.simulator``.

Part of ``planner``, in layer 3 of ``engine.LAYERS``: it may import the layers below
(core to calibration).
"""
