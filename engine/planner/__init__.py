"""jobctl.engine.planner: TODO."""
