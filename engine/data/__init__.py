"""jobctl.engine.data: training data addressed by a global sample index.

``dataset`` builds the spec's data source, so every rank and every resume reads the
same samples for the same step.

In layer 1 of ``engine.LAYERS`` (with model and schedule): it may import the layers
below (core) and, without a cycle, the rest of its own.
"""
