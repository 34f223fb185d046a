"""jobctl.engine.calibration.measure: measuring a calibration on this machine.

``runner.calibrate`` times the model's blocks (``compute``), the links and core sharing
(``comm``, with ``comm_worker`` as each rank), and small real pipeline runs
(``probe``), whose samples ``fit`` turns into the runtime's own costs.
"""
