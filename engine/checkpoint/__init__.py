"""jobctl.engine.checkpoint: TODO."""
