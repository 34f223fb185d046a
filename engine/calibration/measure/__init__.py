"""jobctl.engine.calibration.measure: measuring a calibration on this machine.

``runner.calibrate`` times the model's blocks (``compute``), the links and core sharing
(``comm``, with ``comm_worker`` as each rank), and small real pipeline runs
(``probe``), whose samples ``fit`` turns into the runtime's own costs.

In layer 6 of ``engine.LAYERS`` (with worker): it may import the layers below (core to
pruning and rebalance) and, without a cycle, the rest of its own.
"""
