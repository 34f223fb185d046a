"""Spec sections for the run's phases: elasticity, pruning, rebalancing and checkpoints."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from typing import Annotated, Literal

from pydantic import Field

from .base import SpecModel, Violation
from .limits import MAX_NODES, MAX_PROCESSES, MAX_STEPS

MAX_DEVICES = MAX_NODES * MAX_PROCESSES

DEFAULT_PRUNABLE = ["layers.*.attn.*.weight", "layers.*.mlp.*.weight"]


class ElasticitySpec(SpecModel):
    """How the job survives preemptions and stragglers by morphing onto the devices left."""

    enabled: bool = Field(False, description="Morph (replan) when devices come and go.")
    min_devices: int = Field(
        1, ge=1, le=MAX_DEVICES, description="Fewest devices the job keeps running on."
    )
    max_devices: int | None = Field(
        None,
        ge=1,
        le=MAX_DEVICES,
        description="Most devices the job grows to; null means the whole pool.",
    )
    heartbeat_timeout_s: float = Field(
        30.0, gt=0.0, description="Seconds without a heartbeat before a rank counts as lost."
    )
    straggler_threshold: float = Field(
        0.15, gt=0.0, description="Relative slowdown over the median that marks a straggler."
    )
    exclude_stragglers: bool = Field(
        False, description="Morph stragglers out of the job instead of only reporting them."
    )
    regrow_backoff_s: float = Field(
        60.0,
        ge=0.0,
        description="Seconds after a preemption before the lost capacity counts as back "
        "(local backend); the job then grows back to the pool at its next checkpoint.",
    )

    def _violations(self) -> Iterator[Violation]:
        if self.max_devices is not None and self.max_devices < self.min_devices:
            yield Violation(
                "max_devices",
                f"max_devices {self.max_devices} is below min_devices {self.min_devices}",
                "raise elasticity.max_devices or lower elasticity.min_devices",
            )


class PruningSpec(SpecModel):
    """Gradual global magnitude pruning (Zhu-Gupta cubic schedule)."""

    enabled: bool = Field(False, description="Prune during training.")
    initial_sparsity: float = Field(
        0.0, ge=0.0, lt=1.0, description="Sparsity at `start_step`, in [0, 1)."
    )
    final_sparsity: float = Field(
        0.9, ge=0.0, lt=1.0, description="Sparsity reached at `end_step`, in [0, 1)."
    )
    start_step: int = Field(0, ge=0, le=MAX_STEPS, description="Step of the first pruning event.")
    end_step: int = Field(
        100, ge=1, le=MAX_STEPS, description="Step at which `final_sparsity` is reached."
    )
    frequency: int = Field(10, ge=1, le=MAX_STEPS, description="Steps between pruning events.")
    prunable: list[str] = Field(
        default=DEFAULT_PRUNABLE,
        description="fnmatch globs on full parameter names selecting what may be pruned.",
    )
    sparse_threshold: Annotated[float, Field(gt=0.0, le=1.0)] | Literal["auto"] | None = Field(
        "auto",
        description="When a pruned linear layer computes with torch.sparse CSR kernels instead "
        "of dense ones. 'auto' (default): when its sparsity reaches the CSR/dense crossover "
        "measured on this device for its shape (measured once, cached beside the "
        "calibrations; python -m benchmarks run sparse_crossover prints it), so a layer "
        "switches only "
        "where CSR is faster; a number in (0, 1]: when its sparsity exceeds it; null: "
        "always dense.",
    )

    def _violations(self) -> Iterator[Violation]:
        if self.start_step >= self.end_step:
            yield Violation(
                "start_step",
                f"start_step {self.start_step} must be before end_step {self.end_step}",
                "lower pruning.start_step or raise pruning.end_step",
            )
        if self.initial_sparsity > self.final_sparsity:
            yield Violation(
                "initial_sparsity",
                f"initial_sparsity {self.initial_sparsity} exceeds final_sparsity "
                f"{self.final_sparsity}",
                "pruning only grows sparsity: make initial_sparsity <= final_sparsity",
            )
        span = self.end_step - self.start_step
        if span > 0 and span % self.frequency:
            near = [f for f in range(1, span + 1) if span % f == 0]
            best = min(near, key=lambda f: abs(f - self.frequency))
            yield Violation(
                "frequency",
                f"end_step - start_step = {span} is not a multiple of frequency "
                f"{self.frequency}, so the cubic schedule (s_t at start_step + k * frequency) "
                "never lands on end_step",
                f"set pruning.frequency to a divisor of {span} (e.g. {best}) or pruning.end_step "
                f"to {self.start_step + -(-span // self.frequency) * self.frequency}",
            )
        if not self.prunable:
            yield Violation(
                "prunable",
                "no parameter patterns: nothing could be pruned",
                f"list fnmatch globs on parameter names, e.g. {DEFAULT_PRUNABLE}, "
                "or set pruning.enabled: false",
            )


class RebalancingSpec(SpecModel):
    """Moving layers between stages when stage times drift (e.g. after pruning)."""

    enabled: bool = Field(False, description="Rebalance stages during training.")
    balancer: Literal["diffusion", "partition"] = Field(
        "partition", description="Diffusion (neighbour moves) or a fresh partition."
    )
    by: Literal["time", "params"] = Field(
        "time", description="Balance measured stage time or parameter counts."
    )
    pack: bool = Field(False, description="Pack the model onto fewer devices when it fits.")
    target_devices: int | None = Field(
        None, ge=1, le=MAX_DEVICES, description="Devices to pack onto; null lets the packer choose."
    )
    tolerance: float = Field(
        0.05, ge=0.0, description="Relative imbalance tolerated before layers move."
    )
    hold_steps: int = Field(
        0,
        ge=0,
        le=MAX_STEPS,
        description="Steps to keep training on the old layout after a move is decided, so "
        "one run measures the unbalanced and the rebalanced pipeline (benchmarks).",
    )

    def _violations(self) -> Iterator[Violation]:
        if self.target_devices is not None and not self.pack:
            yield Violation(
                "target_devices",
                f"target_devices {self.target_devices} is set but pack is false",
                "set rebalancing.pack: true, or remove rebalancing.target_devices",
            )


class CheckpointSpec(SpecModel):
    """Per-layer checkpoints, their background upload and retention."""

    interval: int = Field(
        50,
        ge=1,
        le=MAX_STEPS,
        description="Steps between checkpoints; one is always written at the end.",
    )
    local_dir: str | None = Field(
        None, description="Local checkpoint folder; null means <run dir>/checkpoints."
    )
    remote: str | None = Field(
        None,
        description="fsspec URL to upload to (s3://bucket/prefix, file:///path) or an "
        "absolute path.",
    )
    keep_last: int = Field(
        3, ge=1, le=MAX_STEPS, description="Keep this many most recent checkpoints."
    )
    keep_every: int | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="Also keep every checkpoint whose step is a multiple of this.",
    )
    upload_retries: int = Field(
        5, ge=0, le=100, description="Upload retries, with backoff, per shard."
    )
    coalesce: bool = Field(
        True,
        description="When background writes or uploads fall behind training, skip to the "
        "newest checkpoint (bounded memory and lag); false writes and uploads every one, "
        "making training wait if it must.",
    )

    def _violations(self) -> Iterator[Violation]:
        for name in ("local_dir", "remote"):
            value = getattr(self, name)
            if value is not None:
                yield from _path_violations(name, value)
        remote = self.remote
        if remote is not None and not (URL.match(remote) or remote.startswith("/")):
            yield Violation(
                "remote",
                f"remote {remote[:60]!r} is neither a URL nor an absolute path (a bare word "
                "would be a folder beside wherever the workers start)",
                "give a URL such as s3://bucket/prefix or file:///absolute/path",
            )


URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")  # fsspec's protocol://...


def _path_violations(name: str, value: str) -> Iterator[Violation]:
    """A checkpoint path with a control character (a newline, U+2028: a paste gone
    wrong) or a leading '-' (read as an option by the tools it reaches)."""
    bad = next((c for c in value if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")), None)
    if bad is not None:
        yield Violation(
            name,
            f"{name} holds the control character U+{ord(bad):04X}",
            f"write checkpoint.{name} on one line, without control characters",
        )
    elif value.startswith("-") and name == "local_dir":  # a remote must be a URL anyway
        yield Violation(
            name,
            f"{name} {value[:60]!r} starts with '-', which tools read as an option",
            f"write it as ./{value[:60]} (or an absolute path)",
        )
