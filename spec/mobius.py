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

MOBIUS = "mobius"

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


def _not_built(spec: Any) -> list[tuple[str, bool, str, str]]:
    """(field, is it on?, what, why Mobius refuses it): each not built, and what
    building it would take."""
    par = spec.parallelism
    return [
        (
            "parallelism.data_parallel",
            par.data_parallel not in (1, "auto"),
            "data parallelism (D > 1)",
            "a Mobius job is one pipeline over the whole pool; D replicas would each swap "
            "their own records and all-reduce every stage's gradients before its update "
            "on upload (not built)",
        ),
        (
            "parallelism.tensor_parallel",
            par.tensor_parallel != 1,
            "tensor parallelism",
            "Mobius swaps whole stage records through the tier; a T group would swap each "
            "record's T shards in step (not built)",
        ),
        (
            "parallelism.averaging",
            par.averaging != "none",
            "elastic averaging",
            "AvgPipe's N parallel models would multiply every swapped record and the "
            "tier's traffic by N (not built)",
        ),
    ]


def _unsupported(spec: Any) -> Iterator[Violation]:
    for path, on, what, why in _not_built(spec):
        if on:
            off = "none" if path == "parallelism.averaging" else "1"
            fix = _FIX + f"turn off {path} (set it to {off})"
            yield Violation(path, f"schedule mobius does not run {what}: {why}", fix)
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
