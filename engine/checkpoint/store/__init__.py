"""jobctl.engine.checkpoint.store: TODO."""
