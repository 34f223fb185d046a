"""The elastic averaging component's own config: N and alpha, resolved from the spec."""

from __future__ import annotations

from dataclasses import dataclass

from jobctl.spec.sections import ParallelismSpec


@dataclass(frozen=True)
class AveragingConfig:
    """N parallel pipelines, each pulled towards the reference with weight ``alpha``."""

    N: int
    alpha: float

    def __post_init__(self) -> None:
        if self.N < 1 or not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"elastic averaging needs N >= 1 and alpha in [0, 1]: {self}")

    @classmethod
    def from_spec(cls, parallelism: ParallelismSpec) -> AveragingConfig | None:
        """The config of ``parallelism.averaging: elastic``; None when averaging is off.
        ``alpha: auto`` is 1/N (AvgPipe sec. 3.2, after EASGD)."""
        if parallelism.averaging != "elastic":
            return None
        n = parallelism.parallel_pipelines
        if n == "auto" or parallelism.micro_batches is not None:  # a run's spec is resolved
            raise ValueError("parallel_pipelines or micro_batches not resolved by the tuner")
        alpha = 1.0 / n if parallelism.alpha == "auto" else float(parallelism.alpha)
        return cls(N=n, alpha=alpha)
