"""jobctl.engine.channel: TODO."""
