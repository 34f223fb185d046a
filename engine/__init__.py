"""jobctl.engine."""
