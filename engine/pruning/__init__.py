"""jobctl.engine.pruning: TODO."""
