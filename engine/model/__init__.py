"""jobctl.engine.model: models as sequences of blocks, and what each block costs.

``blocks`` builds the builtin GPT family or a user factory's blocks; ``costs`` gives
their analytic FLOPs, parameter, state and activation bytes.
"""
