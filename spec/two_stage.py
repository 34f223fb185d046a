"""The spec side of schedules that host two stages per rank (``zb_v``, ZB-V's V shape).

A ZB-V job cuts the model into 2P stages and runs two of them on each of the P ranks
of a pipeline (``engine.runtime.two_stage``). What does not compose with that yet is
refused here, at validate time, with the field and a fix: the trainer plug-ins that
tune one stage per rank (AvgPipe's (M, N) tuner), packing (another V) and a model too
short for 2P stages. (A traced
model's stages pass their carrier between the V's two stages in memory, its layout
taken from the first: ``runtime.two_stage.v_executor``.) And CUDA:
between ranks d and d+1 the V's down-leg activations and up-leg gradients travel in
the same direction, told apart by their tags on gloo (or by a shared-memory link
each); NCCL ignores tags and would match them by posting order, handing a stage
another stage's tensor of the same shape -- a silently wrong run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from .base import Violation

V_SCHEDULES = ("zb_v",)
#: one_stage_features a V rank runs: pruning selects over any blocks a rank holds and
#: masks its two stages as one (``engine.pruning.selection``); stage-aware ratios are
#: tuned per V device (``engine.planner.v_shape.stage_aware``); rebalancing moves
#: blocks between the 2P stages (``engine.runtime.migration``, memory per device);
#: AvgPipe's N models interleave on each stage (``engine.averaging.interleave``)
V_RUNS = (
    "pruning.enabled",
    "parallelism.recompute",
    "rebalancing.enabled",
    "parallelism.averaging",
)

_FIX = "set parallelism.schedule to zb_h1 (one stage per rank, same B/W split), or "


def two_stage_violations(spec: Any) -> Iterator[Violation]:
    """The rules of ``parallelism.schedule: zb_v`` (``spec`` is a ``JobSpec``)."""
    par = spec.parallelism
    if par.schedule not in V_SCHEDULES:
        return
    fix = lambda path: _FIX + f"turn off {path}"  # noqa: E731
    refused = [f for f in one_stage_features(spec) if f[0] not in V_RUNS]
    yield from refusals(refused, "zb_v (two stages per rank)", fix)
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


def one_stage_features(spec: Any) -> list[tuple[str, bool, str]]:
    """The features built for one resident stage per rank, as (field, is it on?, what):
    a schedule that hosts two stages on a rank (zb_v) or swaps them (mobius) refuses
    them. (The eval pass runs both stages of a ZB-V rank: ``runtime.evaluation``.)"""
    par = spec.parallelism
    return [
        ("pruning.enabled", spec.pruning.enabled, "pruning"),
        ("rebalancing.enabled", spec.rebalancing.enabled, "rebalancing"),
        ("parallelism.averaging", par.averaging != "none", "elastic averaging"),
        ("parallelism.recompute", par.recompute == "stage_aware", "stage-aware recompute"),
    ]


def refusals(
    features: list[tuple[str, bool, str]], schedule: str, fix: Callable[[str], str]
) -> Iterator[Violation]:
    """A violation for each feature that is on: ``schedule`` does not support it yet."""
    for path, used, what in features:
        if used:
            yield Violation(path, f"schedule {schedule} does not support {what} yet", fix(path))
