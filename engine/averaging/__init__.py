"""AvgPipe's elastic averaging framework (AvgPipe sec. 3.2): N parallel pipelines on
the same devices, each training its own parallel model, pulled towards a reference
model that a thread per rank keeps.

* ``config``: :class:`AveragingConfig` (N, alpha), the component's typed config.
* ``rule``: the update rule, steps 1-5, as tensor operations (equations E1-E5).
* ``reference``: the reference model's thread, fed through a queue that never blocks
  the pipeline.
* ``models``: the N parallel models of a rank's stage, their optimizers and their
  shares of the batch.
* ``parts``: :class:`AveragingParts`, all of the above for one rank, from the spec.
* ``interleave``: the N pipelines' micro-batches in one action list, each run on its
  owner's parallel model (one fill and drain per step for all N).
* ``trainer``: the training loop step that runs the N pipelines (a ``Trainer``).
* ``checkpoint``: checkpoints holding the reference and every parallel model; resume
  with the same or another N.
* ``tuning``: the (M, N) tuner of sec. 5.2 for a spec: profile one setting, predict
  all (``averaging.planning.tuning``), resolve ``auto`` N and M; ``profile_rank``: one
  rank of the profile, the runtime's own parts for twenty batches, and before each
  of them the stage alone timed at each candidate's micro-batch size.
"""
