"""jobctl.engine.planner: from a job spec and a calibration to a Plan.

``resolver`` turns a JobSpec into a Plan (fixed or searched P, D, micro-batching,
placement, schedule); ``search`` sweeps the candidate layouts (``layout``: P, D, m, M,
schedule and where the ranks run) and ranks them by simulated step time;
``v_shape`` makes the chosen layout's ZB-V variant (two stages per device);
``tp_search`` searches T x P x D (tensor parallelism, Merak 4.1) with ``tp_costs``
pricing one rank of a T group (``tp_overlap``: sub-pipelined TMP's gain);
``stage_costs`` prices one layout from the calibration (with AvgPipe's N parallel
models and reference through the update strategy ``core.systems.update_of`` gives:
``engine.averaging.planning``) and ``contention`` stretches it by core sharing;
``partition`` splits blocks into stages; ``replicas`` says which D to
try and how many micro-batches each replica runs (any D); ``simulator/`` runs one step
of a schedule. ``cost`` prices a plan to finish the whole job (wall time and dollars:
start-up, checkpoints, expected preemptions; on-demand and spot); ``objective`` chooses
among the priced candidates by ``planner.objective`` within ``budget``. A step system
that plans itself (Mobius: more stages than devices, swapped through a slower tier)
lives in its own room (``engine.mobius.planning``) and ``resolver`` reaches it only
through the registry ``core.systems``: a job that names its schedule, and ``auto``
turning to it when no P x D layout fits memory or when its simulated step beats the
search's plan.

In layer 3 of ``engine.LAYERS``: it may import the layers below (core to calibration).
"""
