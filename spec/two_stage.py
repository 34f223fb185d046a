"""The spec side of schedules that host two stages per rank (``zb_v``, ZB-V's V shape).

A ZB-V job cuts the model into 2P stages and runs two of them on each of the P ranks
of a pipeline (``engine.runtime.two_stage``). Every trainer plug-in reaches them:
pruning selects over any blocks a rank holds and masks its two stages as one
(``engine.pruning.selection``), stage-aware ratios are tuned per V device
(``engine.planner.v_shape.stage_aware``), rebalancing moves blocks between the 2P
stages (``engine.runtime.migration``, memory per device) and AvgPipe's N models
interleave on each stage (``engine.averaging.interleave``). Refused here, at validate
time, with the field, the reason and a fix: AvgPipe's (M, N) tuner (it profiles one
stage per rank), packing (another V) and a model too short for 2P stages. (A traced
model's stages pass their carrier between the V's two stages in memory, its layout
taken from the first: ``runtime.two_stage.v_executor``.) And CUDA:
between ranks d and d+1 the V's down-leg activations and up-leg gradients travel in
the same direction, told apart by their tags on gloo (or by a shared-memory link
each); NCCL ignores tags and would match them by posting order, handing a stage
another stage's tensor of the same shape -- a silently wrong run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .base import Violation

V_SCHEDULES = ("zb_v",)

_FIX = "set parallelism.schedule to zb_h1 (one stage per rank, same B/W split), or "


def two_stage_violations(spec: Any) -> Iterator[Violation]:
    """The rules of ``parallelism.schedule: zb_v`` (``spec`` is a ``JobSpec``)."""
    par = spec.parallelism
    if par.schedule not in V_SCHEDULES:
        return
    if spec.hardware.device == "cuda":
        yield Violation(
            "hardware.device",
            "zb_v's two stages per rank send activations and gradients the same way "
            "between two ranks, told apart by tags, which NCCL ignores",
            _FIX + "run it on CPU workers (hardware.device: cpu)",
        )
    if par.averaging == "elastic" and "auto" in (par.parallel_pipelines, par.micro_batches):
        yield Violation(
            "parallelism.parallel_pipelines",
            "AvgPipe's (M, N) tuner profiles one stage per rank (sec. 5.2.1), not a V rank's two",
            "set parallelism.parallel_pipelines and micro_batches to numbers (e.g. 2 and 4)",
        )
    if spec.rebalancing.enabled and spec.rebalancing.pack:
        yield Violation(
            "rebalancing.pack",
            "packing onto fewer devices would re-cut the V onto P - 1 devices, another "
            "placement of every stage, not a move of blocks between neighbours",
            "set rebalancing.pack: false (rebalancing moves blocks between the 2P stages) "
            "or parallelism.schedule: zb_h1",
        )
    blocks, P = spec.model.num_blocks, par.pipeline_stages
    if isinstance(P, int) and blocks is not None and blocks < 2 * P:
        yield Violation(
            "parallelism.pipeline_stages",
            f"zb_v cuts the model into 2P = {2 * P} stages, but it has {blocks} blocks",
            f"lower parallelism.pipeline_stages to at most {blocks // 2} or raise model.layers",
        )
