"""Mobius's swapping runtime (Feng et al., ASPLOS '23, sec. 3.1): a pipeline of S
stages on N < S ranks, each stage living in the tier below device memory and
uploaded before it runs, the next one prefetched while the current one computes.

* ``layout``: a stage's flat record (parameters | gradients | optimizer slots).
* ``tier``: the tier on a CPU device, record files on local disk moved by an I/O
  thread, and the byte counts of every transfer (``Traffic``).
* ``pinned``: the tier on CUDA, pinned host memory and a priority copy stream.
* ``resident``: the two reserved device buffers and a stage bound into one.
* ``links``: boundary tensors between stages, in memory or between ranks.
* ``runtime``: ``MobiusRunner``, the step (upload, update on load, forward,
  activation offload, backward with recompute, gradients down) and ``SwapConfig``.
* ``planned``: a ``SwapConfig`` from the MIP's stages and the cross mapping.
* ``memory``: the process's resident memory (now and its peak), as tests measure it.
* ``checkpoint``: a rank's records as the block checkpoint a 1f1b rank writes, and
  such a checkpoint (any layout's) loaded into them.
* ``planning/``: the planning half (costs, the MIP partition, the cross mapping, a
  ``schedule: mobius`` job as a Plan, the simulated step, ``auto``'s choice of Mobius),
  which the planner's resolver reaches only through ``core.systems``.

``planned`` joins the two halves; ``worker.mobius`` runs a rank of a run.
"""
