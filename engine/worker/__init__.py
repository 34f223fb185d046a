"""jobctl.engine.worker: the worker process torchrun starts on every node.

``process`` is the entry point (``python -m jobctl.engine.worker.process``): the
plan's rank, the process group, the logs; ``assembly`` builds the trainer with the
plug-ins the spec turns on; ``reference`` is single-process training, the semantics
every parallel layout keeps; ``survival`` is a survivor's part after a lost peer (agree
on the held step, write it as an emergency checkpoint), ``reform`` its re-formation in
place (the supervisor's word, a new process group under a new rank, the trainer
rebuilt in the same process), ``chaos`` the fault
injection the chaos tests aim at one phase of a step; ``mobius`` is a Mobius run's
rank (a plan with ``mobius``: ``MobiusRunner`` with the run's events, stop vote and
checkpoints), which ``assembly`` builds instead of the trainer.

In layer 6 of ``engine.LAYERS`` (with calibration.measure): it may import the layers
below (core to pruning and rebalance) and, without a cycle, the rest of its own.
"""
