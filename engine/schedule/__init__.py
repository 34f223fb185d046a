"""jobctl.engine.schedule: TODO."""
