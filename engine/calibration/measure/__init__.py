"""jobctl.engine.calibration.measure: TODO."""
