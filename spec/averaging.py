"""The spec side of AvgPipe's elastic averaging (``parallelism.averaging``).

``averaging: elastic`` trains N parallel models (``parallel_pipelines``) on the same
devices and pulls each towards a reference model with weight ``alpha`` (``auto``:
1/N, AvgPipe sec. 3.2). The fields live on ``ParallelismSpec`` (which inherits
:class:`AveragingFields`); the rules that tie them to other sections are
:func:`averaging_violations`, called by ``JobSpec``. The (M, N) tuner of sec. 5.2 is
not built, so ``parallel_pipelines: auto`` is refused with a fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from pydantic import Field, field_validator

from .base import SpecModel, Violation, friendly_error

MAX_PARALLEL_PIPELINES = 64


class AveragingFields(SpecModel):
    """``parallelism.averaging``, ``parallel_pipelines`` (N) and ``alpha``."""

    averaging: Literal["none", "elastic"] = Field(
        "none", description="AvgPipe elastic averaging over N parallel pipelines, or none."
    )
    parallel_pipelines: int = Field(
        1, ge=1, le=MAX_PARALLEL_PIPELINES,
        description="N: parallel pipelines (models) per device group (averaging: elastic).",
    )  # fmt: skip
    alpha: float | Literal["auto"] = Field(
        "auto", description="Elastic pull towards the reference in [0, 1]; auto: 1/N."
    )

    @field_validator("parallel_pipelines", mode="before")
    @classmethod
    def _no_tuner(cls, value: Any) -> Any:
        if value == "auto":
            raise friendly_error(
                "no_tuner",
                "parallel_pipelines 'auto' needs AvgPipe's (M, N) tuner, which jobctl "
                "does not have yet",
                fix="set parallelism.parallel_pipelines to an integer, e.g. 2",
            )
        return value

    @field_validator("alpha")
    @classmethod
    def _alpha_in_unit(cls, value: Any) -> Any:
        if value != "auto" and not 0.0 <= value <= 1.0:
            raise friendly_error(
                "alpha_range",
                f"alpha is {value}, outside [0, 1]",
                fix="set parallelism.alpha to a number in [0, 1] or 'auto' (1/N)",
            )
        return value

    def _averaging_violations(self) -> Iterator[Violation]:
        elastic = self.averaging == "elastic"
        if not elastic and self.parallel_pipelines != 1:
            yield Violation(
                "parallel_pipelines",
                f"parallel_pipelines {self.parallel_pipelines} is only used by averaging 'elastic'",
                "set parallelism.averaging: elastic or remove parallelism.parallel_pipelines",
            )
        if not elastic and self.alpha != "auto":
            yield Violation(
                "alpha",
                "alpha is only used by averaging 'elastic'",
                "set parallelism.averaging: elastic or remove parallelism.alpha",
            )


#: Plug-ins that change a stage's weights or layout behind the parallel models' backs.
_EXCLUSIVE = (
    ("pruning", "pruning.enabled"),
    ("rebalancing", "rebalancing.enabled"),
    ("elasticity", "elasticity.enabled"),
)


def averaging_violations(spec: Any) -> Iterator[Violation]:
    """The rules between ``parallelism.averaging: elastic`` and the rest of ``spec``."""
    par = spec.parallelism
    if par.averaging != "elastic":
        return
    for section, path in _EXCLUSIVE:
        if getattr(spec, section).enabled:
            yield Violation(
                path,
                f"{section} does not work with parallelism.averaging: elastic yet",
                f"set {path}: false or parallelism.averaging: none",
            )
    yield from _share_violations(spec)


def _share_violations(spec: Any) -> Iterator[Violation]:
    """Each parallel model trains on B / N samples: whole micro-batches, at least one
    per data-parallel replica."""
    par = spec.parallelism
    batch, micro = spec.training.global_batch_size, spec.training.micro_batch_size
    n = par.parallel_pipelines
    # The planner's m and D know nothing of N yet: they must be fixed to split B in N.
    for path, value in (
        ("training.micro_batch_size", micro),
        ("parallelism.data_parallel", par.data_parallel),
    ):
        if not isinstance(value, int):
            yield Violation(
                path,
                f"averaging: elastic needs a fixed {path.split('.')[1]}, not 'auto'",
                f"set {path} to an integer (B / N shares of whole micro-batches per replica)",
            )
    if not isinstance(micro, int) or not isinstance(par.data_parallel, int):
        return
    d = par.data_parallel
    if batch % (n * micro) or batch // (n * micro) < d:
        yield Violation(
            "parallelism.parallel_pipelines",
            f"global_batch_size {batch} does not split into {n} equal shares of whole "
            f"micro-batches of {micro}, at least one per data-parallel replica ({d})",
            f"make training.global_batch_size a multiple of {n * micro * d} or lower "
            "parallelism.parallel_pipelines",
        )
