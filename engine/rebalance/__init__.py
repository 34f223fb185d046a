"""jobctl.engine.rebalance: moving layers between stages, and packing onto fewer.

Pure balancers on per-block loads (``rebalancer``), from a decision to a new plan with
the simulator's prediction (``replan``), the trainer plug-in that decides, migrates
and hands the trainer its new stage (``hook``), the supervisor's view of its events
(``events``) and a rebalancing preview (``preview``).

In layer 5 of ``engine.LAYERS`` (with pruning): it may import the layers below (core to
runtime, checkpoint, channel and state) and, without a cycle, the rest of its own.
"""
