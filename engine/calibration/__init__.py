"""jobctl.engine.calibration: the calibration record the planner prices plans with.

``record`` is the record itself (block, link, allreduce, host and runtime costs),
``analytic`` derives one from the spec alone, ``cache`` finds and stores measured ones.
Measuring (``measure/``, which runs the trainer) sits in a higher layer.

In layer 2 of ``engine.LAYERS``: it may import the layers below (core to model, schedule
and data).
"""
