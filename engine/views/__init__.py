"""jobctl.engine.views: TODO."""
