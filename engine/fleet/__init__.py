"""jobctl.engine.fleet: TODO."""
