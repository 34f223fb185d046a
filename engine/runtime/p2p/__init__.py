"""jobctl.engine.runtime.p2p: TODO."""
