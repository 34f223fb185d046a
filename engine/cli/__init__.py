"""jobctl.engine.cli: TODO."""
