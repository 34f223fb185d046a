"""jobctl.engine.state: TODO."""
