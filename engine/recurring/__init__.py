"""jobctl.engine.recurring: persisted schedules that resume jobs on their own.

``book`` adds, lists, pauses and removes schedules in the state DB; ``daemon`` is
``jobctl scheduler run``, which fires them; ``trigger`` decides, under a lease,
whether one firing resumes its job; ``procs`` starts the child ``jobctl`` processes
(of the scheduler and the fleet runner) and follows their liveness.

In layer 8 of ``engine.LAYERS`` (with fleet): it may import the layers below (core to
supervise) and, without a cycle, the rest of its own.
"""
