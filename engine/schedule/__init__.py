"""jobctl.engine.schedule: pipeline schedules as per-stage action lists.

``generators`` builds GPipe, 1F1B, Varuna (``varuna``), zero-bubble ZB-H1
(``zero_bubble``) and the other schedules for P stages and M micro-batches;
``checks`` validates a schedule and counts the activations it holds at its peak;
``placement`` holds schedules with two stages per device (per-device lists of
``Placed`` actions, their checks, memory and compact text), which ZB-V
(``zero_bubble.zb_v``) uses; a plan carries them as ``Plan.device_actions``.

In layer 1 of ``engine.LAYERS`` (with model and data): it may import the layers below
(core) and, without a cycle, the rest of its own.
"""
