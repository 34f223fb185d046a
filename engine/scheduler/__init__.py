"""jobctl.engine.scheduler: TODO."""
