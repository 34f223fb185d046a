"""Benchmarks of the planner: how fast it plans and simulates, and how good its choices and
predictions are against real runs."""
