"""jobctl.engine.rebalance: TODO."""
