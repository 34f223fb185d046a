"""jobctl.engine.model: TODO."""
