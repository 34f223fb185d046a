"""jobctl.engine.supervise: TODO."""
