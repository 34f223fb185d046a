"""jobctl.engine.worker: TODO."""
