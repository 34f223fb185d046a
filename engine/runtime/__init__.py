"""jobctl.engine.runtime: one rank's training.

The trainer's loop (``trainer``), the step it runs (``step``: one definition shared with
the calibration probe), the executor of a stage's action list (``executor``) and its
backward split into input and weight gradients for zero-bubble schedules (``backward``),
a rank hosting two stages of a V schedule (``two_stage``: ZB-V, built by the trainer
for a plan with a ``placement``), process groups (``topology``), optimizer and
gradient sums (``optim``), fp16's dynamic loss scale (``loss_scale``), the stop vote
(``stop_vote``), live block migration (``migration``), heartbeat fields
(``vitals``), the hook protocol that
pruning and rebalancing plug in through (``hook``), point-to-point transport (``p2p``)
and a lost peer trapped mid-step with the step commit that keeps survivors consistent
(``failure``). It knows no plug-in by name: ``engine.worker`` assembles them.

In layer 4 of ``engine.LAYERS`` (with checkpoint, channel and state): it may import the
layers below (core to planner) and, without a cycle, the rest of its own.
"""
