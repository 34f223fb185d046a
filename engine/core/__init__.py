"""jobctl.engine.core: the types and names every other part of jobctl shares.

``actions`` (a schedule's forward, recompute and backward actions and their compact
text form), ``plan`` (the Plan written to ``plan.json``), ``phases`` (a run's phases
and their legal transitions), ``events`` (the worker -> supervisor event kinds, their
writer and reader), ``env`` (every ``JOBCTL_*`` environment name), ``process`` (process
identity: alive, start-time token, process trees) and ``home`` (the state home). Only
the standard library, pydantic and ``jobctl.spec`` lie below it; ``jobctl.backends``
may import it.

In layer 0 of ``engine.LAYERS``, the bottom one: it imports no other engine subpackage.
"""
