"""jobctl.engine.calibration: TODO."""
