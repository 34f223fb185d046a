"""jobctl.engine.calibration: the calibration record the planner prices plans with.

``record`` is the record itself (block, link, allreduce, host and runtime costs),
``analytic`` derives one from the spec alone (``analytic_device``: a GPT block on a
known accelerator, from public device facts, with what the runtime adds around its
kernels under autocast: the fp32 gradient path, re-casts, the fp32 loss), ``cache``
finds and stores measured ones, ``startup`` keeps this machine's measured
launch-to-first-step time.
Measuring (``measure/``, which runs the trainer) sits in a higher layer.

In layer 2 of ``engine.LAYERS``: it may import the layers below (core to model, schedule
and data).
"""
