"""The spec side of schedules that host two stages per rank (``zb_v``, ZB-V's V shape).

A ZB-V job cuts the model into 2P stages and runs two of them on each of the P ranks
of a pipeline (``engine.runtime.two_stage``). What does not compose with that yet is
refused here, at validate time, with the field and a fix: the trainer plug-ins that
move or reshape one stage per rank (pruning, rebalancing, an elastic morph, AvgPipe's
N models), the eval pass, Merak's per-stage ratios, imported models (their traced
boundaries carry several tensors) and a model too short for 2P stages.
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
    plugins = [
        ("pruning.enabled", spec.pruning.enabled, "pruning"),
        ("rebalancing.enabled", spec.rebalancing.enabled, "rebalancing"),
        ("elasticity.enabled", spec.elasticity.enabled, "an elastic morph"),
        ("parallelism.averaging", par.averaging != "none", "elastic averaging"),
        ("training.eval_every", bool(spec.training.eval_every), "the eval pass"),
        ("parallelism.recompute", par.recompute == "stage_aware", "stage-aware recompute"),
        ("model.import", spec.model.family is None, "an imported model"),
    ]
    for path, used, what in plugins:
        if used:
            yield Violation(
                path,
                f"schedule zb_v (two stages per rank) does not support {what} yet",
                _FIX + f"turn off {path}",
            )
    blocks, P = spec.model.num_blocks, par.pipeline_stages
    if isinstance(P, int) and blocks is not None and blocks < 2 * P:
        yield Violation(
            "parallelism.pipeline_stages",
            f"zb_v cuts the model into 2P = {2 * P} stages, but it has {blocks} blocks",
            f"lower parallelism.pipeline_stages to at most {blocks // 2} or raise model.layers",
        )
