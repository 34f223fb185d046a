"""jobctl.engine.data: training data addressed by a global sample index.

``dataset`` builds the spec's data source, so every rank and every resume reads the
same samples for the same step.
"""
