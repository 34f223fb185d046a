"""jobctl.engine.core: TODO."""
