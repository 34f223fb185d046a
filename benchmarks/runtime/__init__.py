"""Benchmarks of the runtime: schedules, parallelism, Mobius, rebalancing, pruning kernels
and start-up, against PyTorch or simpler ways of the same run."""
