"""The spec side of tensor parallelism inside pipeline stages (Merak sec. 4.1).

``parallelism.tensor_parallel: T`` splits each stage's attention and MLP linears
over T processes, Megatron-style (column- then row-parallel): found on the traced
graph of an unmodified model (``engine.model.graph.tp_plan``), or the builtin GPT's
own plan on its blocks (``engine.model.gpt_tp``). The fields live on
``ParallelismSpec`` (which inherits :class:`TensorParallelFields`); the rules that tie
T to the pool and the model section are :func:`tensor_parallel_violations`, called
by ``JobSpec``. That T divides the model's heads and hidden sizes needs the built
model, so ``engine.model.graph.checks`` checks it at ``validate`` too. The features
whose runtime has no T ranks per stage (:data:`NOT_WITH_T`) are refused with T > 1.
``tensor_parallel: auto`` is resolved by the planner's search over T x P x D
(``engine.planner.tp_search``), which keeps to these rules: T = 1 where a feature of
:data:`NOT_WITH_T` is on or the model is a user's hand-cut blocks, and the plan says
why.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    StrictBool,
    WrapValidator,
)

from .base import SpecModel, Violation, one_error

MAX_TENSOR_PARALLEL = 64
FIELD = "parallelism.tensor_parallel"

#: Features that do not run with T > 1 yet: (field, is it on?, why not). AvgPipe's
#: N models run split (each copy split as the stage is) at a fixed (M, N). Elasticity
#: runs: a lost node's survivors hold T-shards, not whole blocks, so they hand no step
#: over and the run resumes from its newest checkpoint, re-planned with T
#: (tests/integration/test_chaos_tensor_parallel.py).
NOT_WITH_T = (
    (
        "rebalancing.pack",
        lambda s: s.rebalancing.enabled and s.rebalancing.pack,
        "packing re-places whole T groups onto fewer devices; rebalancing moves each "
        "block's T shards between the stages' groups, not groups between devices",
    ),
    (
        "parallelism.parallel_pipelines",
        lambda s: (
            s.parallelism.averaging == "elastic"
            and "auto" in (s.parallelism.parallel_pipelines, s.parallelism.micro_batches)
        ),
        "AvgPipe's (M, N) tuner profiles an unsplit stage (sec. 5.2.1), not a T group's shard",
    ),
)
#: How to turn a NOT_WITH_T feature off where that is not just its switch.
_OFF = {
    "parallelism.parallel_pipelines": "set parallelism.parallel_pipelines and "
    "micro_batches to numbers (e.g. 2 and 4)",
    "rebalancing.pack": "set rebalancing.pack: false",
}


TensorParallel = Annotated[
    Annotated[int, Field(ge=1, le=MAX_TENSOR_PARALLEL)] | Literal["auto"],
    WrapValidator(
        one_error(
            "tensor_parallel",
            f"an integer 1..{MAX_TENSOR_PARALLEL} or 'auto'",
            fix="set parallelism.tensor_parallel to 1 (off), a divisor of "
            "hardware.processes_per_node, or auto (the planner searches T)",
        )
    ),
]
TPSubpipeline = Annotated[
    Literal["auto"] | StrictBool,
    WrapValidator(
        one_error(
            "tp_subpipeline",
            "auto, true or false",
            fix="set parallelism.tp_subpipeline to auto (the planner decides), true or false",
        )
    ),
]


class TensorParallelFields(SpecModel):
    """``parallelism.tensor_parallel`` (T, or ``auto``: the planner's search)."""

    tensor_parallel: TensorParallel = Field(
        1,
        description="T: processes that split each stage's linears (Megatron TMP); 1: "
        "off; auto: the planner searches T x P x D (engine.planner.tp_search)",
    )
    tp_subpipeline: TPSubpipeline = Field(
        "auto",
        description="Merak 5.3: each micro-batch of a split stage as two halves, "
        "one all-reducing while the other computes; auto: where engine.planner.tp_overlap "
        "predicts a gain",
    )


def tensor_parallel_violations(spec: Any) -> Iterator[Violation]:
    """The rules between ``parallelism.tensor_parallel`` and the rest of ``spec``."""
    T = spec.parallelism.tensor_parallel
    yield from _subpipeline_violations(spec, T)
    if T in (1, "auto"):  # auto: the planner keeps to what the rules below allow
        return
    yield from _builtin_violations(spec, T)
    for field, on, why in NOT_WITH_T:
        if on(spec):
            yield Violation(
                field,
                f"does not run with tensor_parallel {T}: {why}",
                f"{_OFF.get(field, f'turn {field} off')} or set parallelism.tensor_parallel: 1",
            )
    hw = spec.hardware
    if hw.processes_per_node % T:
        yield Violation(
            FIELD,
            f"a tensor-parallel group of {T} must sit inside one node, but a node runs "
            f"{hw.processes_per_node} processes",
            f"set hardware.processes_per_node to a multiple of {T} or lower "
            "parallelism.tensor_parallel",
        )
    P, D = spec.parallelism.pipeline_stages, spec.parallelism.data_parallel
    # Mobius's S may outnumber the devices: its own rule refuses T, with the reason
    exempt = spec.parallelism.schedule == "mobius"
    if isinstance(P, int) and isinstance(D, int) and hw.devices < T * P * D and not exempt:
        yield Violation(
            FIELD,
            f"T x P x D = {T} x {P} x {D} = {T * P * D} processes but the pool has "
            f"{hw.devices} ({hw.nodes} nodes x {hw.processes_per_node} processes)",
            "lower parallelism.tensor_parallel/pipeline_stages/data_parallel or raise "
            "hardware.nodes",
        )


def _builtin_violations(spec: Any, T: int) -> Iterator[Violation]:
    """The builtin GPT splits its blocks' heads over T (``engine.model.gpt_tp``): T
    must divide ``model.heads``; its hand-written blocks run plain TMP (sub-pipelining
    halves a traced subgraph's micro-batch)."""
    m = spec.model
    if m.family is None:
        return  # a traced model: engine.model.graph.checks checks it at validate
    if m.heads % T:
        yield Violation(
            FIELD,
            f"tensor_parallel {T} splits each block's {m.heads} heads, which {T} does not divide",
            f"set parallelism.tensor_parallel to a divisor of model.heads ({m.heads})",
        )
    if spec.parallelism.tp_subpipeline is True:
        yield Violation(
            "parallelism.tp_subpipeline",
            "true sub-pipelines traced subgraphs; the builtin GPT's blocks run plain TMP",
            "set parallelism.tp_subpipeline: auto (or false)",
        )


def _subpipeline_violations(spec: Any, T: int | str) -> Iterator[Violation]:
    """``tp_subpipeline: true`` needs a split stage, a micro-batch that halves and a
    whole backward (the halves' backward runs by hand, not as ZB-H1's B and W)."""
    if spec.parallelism.tp_subpipeline is not True:
        return
    field, m = "parallelism.tp_subpipeline", spec.training.micro_batch_size
    if T == 1:
        yield Violation(
            field,
            "true needs tensor_parallel > 1: no split stage to sub-pipeline",
            "set parallelism.tp_subpipeline: auto (or false), or parallelism.tensor_parallel > 1",
        )
    if isinstance(m, int) and m % 2:
        yield Violation(
            field,
            f"true splits each micro-batch in two halves, but training.micro_batch_size is {m}",
            "set an even training.micro_batch_size or parallelism.tp_subpipeline: auto",
        )
    if spec.parallelism.schedule == "zb_h1":
        yield Violation(
            field,
            "true runs the halves' backward by hand, which ZB-H1's "
            "split of the backward into B and W does not take",
            "set parallelism.tp_subpipeline: auto (or false), or another parallelism.schedule",
        )
