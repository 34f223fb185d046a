"""What AvgPipe's elastic averaging adds to a stage's memory (AvgPipe sec. 5.2.3, F_mod).

A rank holds N parallel models of its stage, each with gradients and its own
optimizer state (N x the synchronous training state), the reference's weights, and
at most one batch's N local updates (the last one is still ``before``'s copy while
its optimizer steps; a pipeline waits for r_t before it sends, so batch t's updates
never meet batch t-1's in the queue). The activations need nothing more: the N
pipelines run interleaved in the plan's one action list over the batch's B / (m D)
micro-batches (``averaging.interleave``), so the schedule's peaks, which the memory
check already counts, are the step's.

Its step (``calibration``) is the synchronous step's action list with every
stage's optimizer step N times (E1, one per parallel model). The rule's few passes
over the weights (E2-E3, and E4-E5 on the reference's thread) are not priced: the
prediction is a lower bound by that much.

The planner's search reaches these through ``strategy`` (the entry ``core.systems``
registers for ``averaging: elastic``), never by importing this module.
"""

from __future__ import annotations

from jobctl.engine.calibration.record import Calibration, Stat
from jobctl.spec import JobSpec


def parallel_pipelines(spec: JobSpec) -> int:
    """N; ValueError while the tuner has not resolved N or M (``averaging.tuning``)."""
    par = spec.parallelism
    if par.parallel_pipelines == "auto" or par.micro_batches is not None:
        raise ValueError(
            "parallelism.parallel_pipelines or micro_batches is not resolved: the (M, N) "
            "tuner writes them out (jobctl plan and jobctl apply run it)"
        )
    return par.parallel_pipelines


def memory(
    spec: JobSpec, cal: Calibration, stages: list[list[int]], one: list[float]
) -> list[float]:
    """Bytes per stage from ``one``, the search's bytes for one model
    (``planner.stage_costs.stage_memory``), with, under ``parallelism.averaging:
    elastic``, the other N - 1 parallel models, the reference and the N local
    updates."""
    par = spec.parallelism
    if par.averaging != "elastic":
        return one
    n = parallel_pipelines(spec)
    out = []
    for blocks, mem in zip(stages, one, strict=True):
        state = sum(cal.blocks[b].state_bytes for b in blocks)
        weights = sum(cal.blocks[b].param_bytes for b in blocks)
        out.append(mem + (n - 1) * state + (1 + n) * weights)
    return out


def refusal_note(spec: JobSpec) -> str:
    """What a memory refusal adds when the N parallel models take part in it."""
    par = spec.parallelism
    if par.averaging != "elastic":
        return ""
    return (
        f" with N={par.parallel_pipelines} parallel models and the reference (lower "
        "parallelism.parallel_pipelines)"
    )


def calibration(spec: JobSpec, cal: Calibration) -> Calibration:
    """``cal`` with each block's optimizer step N times under ``averaging: elastic``."""
    par = spec.parallelism
    if par.averaging != "elastic":
        return cal
    n = parallel_pipelines(spec)
    if n == 1:
        return cal
    blocks = [
        b.model_copy(update={"optimizer": Stat(median=b.optimizer.median * n, n=b.optimizer.n)})
        for b in cal.blocks
    ]
    return cal.model_copy(update={"blocks": blocks})
