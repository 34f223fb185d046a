"""Benchmarks of data and event I/O: real data sources, data prepare, checkpoint uploads
and the event channel."""
