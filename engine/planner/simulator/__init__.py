"""jobctl.engine.planner.simulator: TODO."""
