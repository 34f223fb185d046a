"""jobctl.engine.data: TODO."""
