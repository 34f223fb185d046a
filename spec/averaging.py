"""The spec side of AvgPipe's elastic averaging (``parallelism.averaging``).

``averaging: elastic`` trains N parallel models (``parallel_pipelines``) on the same
devices and pulls each towards a reference model with weight ``alpha`` (``auto``:
1/N, AvgPipe sec. 3.2). ``micro_batches`` is AvgPipe's M, each parallel pipeline's
micro-batches per batch and replica (so a micro-batch holds B / (D N M) samples);
unset, ``training.micro_batch_size`` decides. ``parallel_pipelines: auto`` and
``micro_batches: auto`` are resolved by the (M, N) tuner of sec. 5.2
(``engine.averaging.tuning``, run by ``jobctl plan`` and ``jobctl apply``) among
:func:`elastic_settings`. The fields live on ``ParallelismSpec`` (which inherits
:class:`AveragingFields`); the rules that tie them to other sections are
:func:`averaging_violations`, called by ``JobSpec``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from .base import SpecModel, Violation, friendly_error

MAX_PARALLEL_PIPELINES = 64
#: The largest N the tuner tries (AvgPipe's experiments go up to 8).
TUNED_N_MAX = 8


class AveragingFields(SpecModel):
    """``parallelism.averaging``, ``parallel_pipelines`` (N) and ``alpha``."""

    averaging: Literal["none", "elastic"] = Field(
        "none", description="AvgPipe elastic averaging over N parallel pipelines, or none."
    )
    parallel_pipelines: Annotated[int, Field(ge=1, le=MAX_PARALLEL_PIPELINES)] | Literal["auto"] = (
        Field(
            1,
            description="N: parallel pipelines (models) per device group (averaging: "
            "elastic); auto: tuned with M by profiling (AvgPipe sec. 5.2).",
        )
    )
    micro_batches: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        None,
        description="M: micro-batches per parallel pipeline, batch and replica "
        "(averaging: elastic; a micro-batch holds B / (D N M) samples); auto: tuned with "
        "N; null: training.micro_batch_size decides.",
    )
    alpha: float | Literal["auto"] = Field(
        "auto", description="Elastic pull towards the reference in [0, 1]; auto: 1/N."
    )

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
        if not elastic and self.micro_batches is not None:
            yield Violation(
                "micro_batches",
                "micro_batches (AvgPipe's M) is only used by averaging 'elastic'",
                "set parallelism.averaging: elastic or remove parallelism.micro_batches",
            )
        if not elastic and self.alpha != "auto":
            yield Violation(
                "alpha",
                "alpha is only used by averaging 'elastic'",
                "set parallelism.averaging: elastic or remove parallelism.alpha",
            )


def averaging_violations(spec: Any) -> Iterator[Violation]:
    """The rules between ``parallelism.averaging: elastic`` and the rest of ``spec``."""
    par = spec.parallelism
    if par.averaging != "elastic":
        return
    # Pruning and rebalancing run: masks hold on every copy, migrations move them all.
    yield from _share_violations(spec)


def elastic_settings(
    B: int, N_max: int, M: int | None, N: int | None, size: int | None
) -> list[tuple[int, int]]:
    """Every (M, N) whose micro-batches hold whole samples: N M divides ``B`` (a
    replica's samples per batch), under whichever of M, N and the micro-batch size
    ``size`` are fixed (None: free, N up to ``N_max``)."""
    out = []
    for n in [N] if N is not None else range(1, N_max + 1):
        for m in [M] if M is not None else range(1, B // n + 1):
            if B % (n * m) or size not in (None, B // (n * m)):
                continue
            out.append((m, n))
    return out


def _fixed(value: Any) -> int | None:
    return value if isinstance(value, int) else None


def _share_violations(spec: Any) -> Iterator[Violation]:
    """Each parallel model trains on B / N samples: whole micro-batches, at least one
    per data-parallel replica; with ``auto`` N or M, at least one setting must."""
    par, batch = spec.parallelism, spec.training.global_batch_size
    micro, M, N, d = (
        spec.training.micro_batch_size,
        par.micro_batches,
        par.parallel_pipelines,
        par.data_parallel,
    )
    if not isinstance(d, int):
        yield Violation(
            "parallelism.data_parallel",
            "averaging: elastic needs a fixed data_parallel, not 'auto'",
            "set parallelism.data_parallel to an integer (B / N shares of whole "
            "micro-batches per replica)",
        )
        return
    if M is None and not isinstance(micro, int):
        yield Violation(
            "training.micro_batch_size",
            "averaging: elastic needs a fixed micro_batch_size, not 'auto', or "
            "parallelism.micro_batches (M)",
            "set training.micro_batch_size to an integer, or parallelism.micro_batches "
            "to an integer or 'auto'",
        )
        return
    if M is not None and isinstance(micro, int):
        yield Violation(
            "parallelism.micro_batches",
            f"micro_batches ({M}) and training.micro_batch_size ({micro}) both set the "
            "micro-batch size (B / (D N M))",
            "remove one: set training.micro_batch_size: auto, or remove parallelism.micro_batches",
        )
        return
    yield from _split_violations(batch, d, _fixed(M), _fixed(N), _fixed(micro), "auto" in (M, N))


def _split_violations(
    batch: int, d: int, M: int | None, N: int | None, micro: int | None, tuned: bool
) -> Iterator[Violation]:
    """B splits over D replicas, N shares and M micro-batches of whole samples."""
    path = "parallelism.parallel_pipelines"
    if M is None and not tuned:  # N and m fixed: replicas deal micro-batches (any D)
        if batch % (N * micro) or batch // (N * micro) < d:
            yield Violation(
                path,
                f"global_batch_size {batch} does not split into {N} equal shares of whole "
                f"micro-batches of {micro}, at least one per data-parallel replica ({d})",
                f"make training.global_batch_size a multiple of {N * micro * d} or lower "
                "parallelism.parallel_pipelines",
            )
        return
    if batch % d:
        yield Violation(
            path,
            f"global_batch_size {batch} does not split over {d} data-parallel replicas "
            "(each replica runs the N parallel pipelines on B / D samples)",
            f"make training.global_batch_size a multiple of {d}",
        )
    elif not elastic_settings(batch // d, TUNED_N_MAX if tuned else 1, M, N, micro):
        fixed = ", ".join(
            f"{k}={v}" for k, v in (("N", N), ("M", M), ("micro_batch_size", micro)) if v
        )
        yield Violation(
            "parallelism.micro_batches" if M is not None and N is None else path,
            f"global_batch_size {batch} over {d} replicas does not split into N equal "
            f"shares of M whole micro-batches ({fixed or 'N up to ' + str(TUNED_N_MAX)})",
            "make training.global_batch_size a multiple of "
            f"{(N or 1) * (M or 1) * (micro or 1) * d} or lower "
            "parallelism.parallel_pipelines / parallelism.micro_batches",
        )
