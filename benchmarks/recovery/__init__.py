"""Benchmarks of recovery: a lost node to the next step, resuming from a checkpoint, and
what checkpointing costs a step."""
