"""jobctl.engine.runtime: TODO."""
