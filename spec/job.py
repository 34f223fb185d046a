"""The whole job spec and the rules that tie its sections together."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

from pydantic import Field, field_validator

from .averaging import averaging_violations
from .base import SpecModel, Violation, require_match
from .cost import BudgetSpec, PlannerSpec, cost_violations
from .data import UINT16_VOCAB, DataSpec
from .devices import DEVICES
from .mobius import mobius_violations, pool_exempt
from .phases import CheckpointSpec, ElasticitySpec, PruningSpec, RebalancingSpec
from .schedule import ScheduleSpec
from .sections import HardwareSpec, ModelSpec, ParallelismSpec, TrainingSpec
from .tensor_parallel import tensor_parallel_violations
from .topology import topology_violations
from .two_stage import two_stage_violations

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
NAME_FIX = (
    "use lowercase letters, digits, '.', '_' and '-' (at most 63 characters, "
    "starting with a letter or digit)"
)


def require_name(
    value: str, kind: str, *, suggestion: str | None = None, fix: str = NAME_FIX
) -> str:
    """``value`` if it is a safe ``kind`` name (a job's, a fleet's: ``NAME_PATTERN``, fit
    for file names, Kubernetes and Slurm), else a ``{kind}_name`` error."""
    return require_match(
        value,
        NAME_PATTERN,
        f"{kind}_name",
        f"{value!r} is not a valid {kind} name",
        suggestion=suggestion,
        fix=fix,
    )


def _section(model: type[SpecModel], description: str) -> Any:
    """A section that may be left out: its model's defaults stand in."""
    return Field(default_factory=model, description=description)


class JobSpec(SpecModel):
    """One training job: what to train, on which devices, how to split it, how to run it."""

    name: str = Field(
        ...,
        description="Job name, safe for file names, Kubernetes and Slurm: lowercase letters, "
        "digits, '.', '_' and '-', at most 63 characters.",
        json_schema_extra={"pattern": NAME_PATTERN},
    )
    model: ModelSpec = Field(..., description="The model to train.")
    data: DataSpec = _section(DataSpec, "Where samples come from.")
    training: TrainingSpec = Field(..., description="Batch sizes, steps and optimizer.")
    hardware: HardwareSpec = _section(HardwareSpec, "The device pool and its launcher.")
    parallelism: ParallelismSpec = _section(
        ParallelismSpec, "Pipeline/data parallelism and schedule."
    )
    elasticity: ElasticitySpec = _section(ElasticitySpec, "Preemption and straggler handling.")
    pruning: PruningSpec = _section(PruningSpec, "Gradual magnitude pruning.")
    rebalancing: RebalancingSpec = _section(RebalancingSpec, "Stage rebalancing and packing.")
    checkpoint: CheckpointSpec = _section(CheckpointSpec, "Checkpoints, uploads and retention.")
    schedule: ScheduleSpec | None = Field(
        None, description="When to resume the job from its latest checkpoint; null = run once."
    )
    budget: BudgetSpec = _section(BudgetSpec, "What the whole job may cost, in USD.")
    planner: PlannerSpec = _section(PlannerSpec, "What the planner optimises.")

    @field_validator("name")
    @classmethod
    def _name_is_safe(cls, value: str) -> str:
        return require_name(value, "job", suggestion=_slug(value))

    def _violations(self) -> Iterator[Violation]:
        yield from self._pool_violations()
        yield from self._stage_violations()
        yield from self._batch_violations()
        yield from self._pruning_violations()
        yield from self._data_violations()
        yield from self._device_violations()
        yield from cost_violations(self.hardware, self.budget)
        yield from averaging_violations(self)
        yield from topology_violations(self.hardware)
        yield from two_stage_violations(self)
        yield from tensor_parallel_violations(self)
        yield from mobius_violations(self)

    def _device_violations(self) -> Iterator[Violation]:
        hw, precision = self.hardware, self.training.precision
        if hw.accelerator is None:
            return
        if hw.device != "cuda":
            yield Violation(
                "hardware.accelerator",
                f"accelerator {hw.accelerator!r} is a GPU, but hardware.device is {hw.device!r}",
                "set hardware.device: cuda or remove hardware.accelerator",
            )
        rates = DEVICES[hw.accelerator].peak_tflops
        if precision not in rates:
            yield Violation(
                "training.precision",
                f"{hw.accelerator} has no {precision} rate (it lists {', '.join(rates)})",
                f"set training.precision to one of {', '.join(rates)}",
            )

    def _data_violations(self) -> Iterator[Violation]:
        data, vocab = self.data, self.model.vocab
        if self.model.family is not None and data.dtype == "uint16" and vocab > UINT16_VOCAB:
            yield Violation(
                "data.dtype",
                f"uint16 holds token ids below {UINT16_VOCAB}, but model.vocab is {vocab}",
                "set data.dtype: uint32 (and write the token file as uint32)",
            )
        if self.training.eval_every and data.eval is None:
            yield Violation(
                "training.eval_every",
                "eval_every needs a validation split, but data.eval is not set",
                "add data.eval: 0.05 (a held-out fraction) or a path, or remove eval_every",
            )

    def _pruning_violations(self) -> Iterator[Violation]:
        p, steps = self.pruning, self.training.steps
        if p.enabled and p.end_step > steps:
            yield Violation(
                "pruning.end_step",
                f"end_step {p.end_step} is after the last training step {steps}: the run "
                f"would stop before reaching final_sparsity {p.final_sparsity}",
                f"lower pruning.end_step to at most {steps} or raise training.steps",
            )

    def _pool_violations(self) -> Iterator[Violation]:
        p, d, hw = self.parallelism.pipeline_stages, self.parallelism.data_parallel, self.hardware
        if pool_exempt(self):  # Mobius: S stages may outnumber the devices
            return
        if isinstance(p, int) and isinstance(d, int) and p * d > hw.devices:
            yield Violation(
                "parallelism.pipeline_stages",
                f"P x D = {p * d} devices but the pool has {hw.devices} "
                f"({hw.nodes} nodes x {hw.processes_per_node} processes)",
                "lower parallelism.pipeline_stages/data_parallel or raise hardware.nodes",
            )

    def _stage_violations(self) -> Iterator[Violation]:
        p, blocks = self.parallelism.pipeline_stages, self.model.num_blocks
        if isinstance(p, int) and blocks is not None and p > blocks:
            yield Violation(
                "parallelism.pipeline_stages",
                f"cannot split {blocks} blocks into {p} stages "
                f"(embedding + {self.model.layers} layers + head)",
                f"lower parallelism.pipeline_stages to at most {blocks} or raise model.layers",
            )

    def _batch_violations(self) -> Iterator[Violation]:
        # Any D: replicas take whole micro-batches, N // D or one more (Sharding), so
        # only the micro-batch size must divide the global batch.
        batch, micro = self.training.global_batch_size, self.training.micro_batch_size
        d = self.parallelism.data_parallel
        if isinstance(micro, int) and batch % micro:
            yield Violation(
                "training.micro_batch_size",
                f"global_batch_size is {batch}, which is not a multiple of micro_batch_size "
                f"{micro}",
                f"set training.micro_batch_size to a divisor of {batch} "
                f"({_divisors(batch)}) or 'auto'",
            )
            return
        per = micro if isinstance(micro, int) else 1
        if isinstance(d, int) and batch // per < d:
            yield Violation(
                "training.global_batch_size",
                f"global_batch_size {batch} gives {batch // per} micro-batches of "
                f"{per}, fewer than data_parallel {d}: some replica would get none",
                f"raise training.global_batch_size to at least {d * per} or lower "
                "parallelism.data_parallel",
            )


def _slug(value: str) -> str | None:
    """A valid job name close to ``value``, or None if nothing usable is left."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", value.strip().lower())
    slug = re.sub(r"^[^a-z0-9]+", "", slug)[:63]
    return slug or None


def _divisors(n: int, limit: int = 8) -> str:
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    found = sorted(set(small) | {n // k for k in small})
    shown = ", ".join(str(k) for k in found[:limit])
    return shown + (", ..." if len(found) > limit else "")
