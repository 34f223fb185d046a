"""The spec side of ``parallelism.schedule: mobius`` (Mobius, Feng et al., ASPLOS '23).

A Mobius job cuts the model into S = ``parallelism.pipeline_stages`` stages over the
N devices of the pool (``hardware.devices``), S > N: each stage lives in the tier
below device memory and is uploaded before it runs (``engine.mobius``), under
``hardware.memory_gb`` per process. So ``pipeline_stages`` may exceed the pool here,
and one pipeline uses the whole pool. Pruning masks the swapped records and
rebalancing re-cuts the S stages (``engine.mobius.relayout``). Refused at validate
time with the field, the reason and a fix: data or tensor parallelism and AvgPipe's
averaging (not built: a T group or N models would swap shards or copies of every
record in step), packing (S and each stage's rank are the cross mapping's: a re-cut
keeps them), Merak's stage-aware ratios (physical: every Mobius stage recomputes its
forward already) and ``auto`` stages (S is the user's: the MIP cuts the blocks into
exactly S stages).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .base import Violation
from .two_stage import one_stage_features, refusals

MOBIUS = "mobius"

#: one_stage_features that Mobius refuses with a reason of its own
_OWN_RULE = ("parallelism.recompute",)
#: one_stage_features Mobius runs: pruning masks its swapped records
#: (``engine.pruning.swapped``), rebalancing re-cuts them (``engine.rebalance.swapped``)
_RUNS = ("pruning.enabled", "rebalancing.enabled")

_FIX = "set parallelism.schedule to 1f1b (one stage per device, all resident), or "


def pool_exempt(spec: Any) -> bool:
    """Whether ``spec``'s stages may outnumber its devices (a Mobius job's do)."""
    return spec.parallelism.schedule == MOBIUS


def mobius_violations(spec: Any) -> Iterator[Violation]:
    """The rules of ``parallelism.schedule: mobius`` (``spec`` is a ``JobSpec``)."""
    par = spec.parallelism
    if par.schedule != MOBIUS:
        return
    yield from _unsupported(spec)
    yield from _stage_count(spec)


def _unsupported(spec: Any) -> Iterator[Violation]:
    par = spec.parallelism
    features = [
        (
            "parallelism.data_parallel",
            par.data_parallel not in (1, "auto"),
            "data parallelism (D > 1)",
        ),
        ("parallelism.tensor_parallel", par.tensor_parallel != 1, "tensor parallelism"),
        *[f for f in one_stage_features(spec) if f[0] not in _OWN_RULE + _RUNS],
    ]
    yield from refusals(
        features,
        "mobius (stages swapped through host memory or disk)",
        lambda path: _FIX + f"turn off {path}" + (" (set it to 1)" if "parallel" in path else ""),
    )
    yield from _own_rules(spec)


def _own_rules(spec: Any) -> Iterator[Violation]:
    """What Mobius refuses for a reason of its own."""
    if spec.rebalancing.enabled and spec.rebalancing.pack:
        yield Violation(
            "rebalancing.pack",
            "schedule mobius already runs more stages than devices, each stage's rank "
            "placed by the cross mapping (sec. 3.3); rebalancing re-cuts the S stages on "
            "the same ranks and frees none",
            "remove rebalancing.pack (a smaller pool: fewer hardware.processes_per_node)",
        )
    if spec.parallelism.recompute == "stage_aware":
        yield Violation(
            "parallelism.recompute",
            "schedule mobius recomputes every stage's forward from its offloaded input "
            "(Mobius sec. 3.1): no activations stay resident for stage-aware ratios to keep",
            _FIX + "remove parallelism.recompute (Mobius always recomputes)",
        )


def _stage_count(spec: Any) -> Iterator[Violation]:
    S, N = spec.parallelism.pipeline_stages, spec.hardware.devices
    if not isinstance(S, int):
        yield Violation(
            "parallelism.pipeline_stages",
            "schedule mobius needs the stage count S, not 'auto'",
            f"set parallelism.pipeline_stages to a number above the pool's {N} devices "
            f"(e.g. {2 * N})",
        )
    elif S <= N:
        yield Violation(
            "parallelism.pipeline_stages",
            f"a Mobius pipeline has more stages than devices: S = {S}, N = {N} "
            f"({spec.hardware.nodes} nodes x {spec.hardware.processes_per_node} processes)",
            f"raise parallelism.pipeline_stages above {N}, or use schedule 1f1b for S <= N",
        )
