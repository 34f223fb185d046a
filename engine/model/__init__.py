"""jobctl.engine.model: models as sequences of blocks, and what each block costs.

``blocks`` builds the builtin GPT family or a user factory's blocks; ``costs`` gives
their analytic FLOPs, parameter, state and activation bytes; ``graph`` traces and
shards an unmodified model (Merak sec. 4) into subgraphs that serve as blocks.

In layer 1 of ``engine.LAYERS`` (with schedule and data): it may import the layers below
(core) and, without a cycle, the rest of its own.
"""
