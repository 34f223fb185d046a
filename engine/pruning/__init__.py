"""jobctl.engine.pruning: gradual global magnitude pruning of a pipeline (DynPipe).

The schedule (``schedule``), selection of what to prune (``selection``, collective
over a pipeline with ``comm``), the per-rank ``Pruner`` with its masks and the
per-block profile after a pruning step (``profile``), sparse compute (``sparse``,
``crossover``), the trainer plug-in (``hook``), the supervisor's view of pruning
events (``events``) and the planner's preview of a pruned run (``preview``).

In layer 5 of ``engine.LAYERS`` (with rebalance): it may import the layers below (core
to runtime, checkpoint, channel and state) and, without a cycle, the rest of its own.
"""
