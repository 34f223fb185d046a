"""The N parallel models of one rank's stage (AvgPipe sec. 3.2), their optimizers and
the share of each batch each one trains on.

Parallel model 0 is the stage the trainer was built with; models 1 .. N-1 are copies
of it (the same initial weights), each with its own optimizer of the spec's kind, so
any optimizer works (step 1). Batch t's B samples are dealt in N contiguous shares of
B / N; ``PipelineShare`` deals model i's share over the D replicas as a synchronous
batch of B / N would be (``Sharding``), so model i's gradient is the mean over its own
share. A step runs the N shares interleaved (``interleave.InterleavedShare``), which
deals the same samples over the replicas as a synchronous batch of B; the sum over the
replicas, and so each gradient, is the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from jobctl.engine.data.dataset import Sharding
from jobctl.engine.model.blocks import Stage
from jobctl.engine.runtime.optim import build_optimizer
from jobctl.spec.sections import TrainingSpec


@dataclass(frozen=True)
class PipelineShare:
    """The samples parallel pipeline ``i`` of ``N`` trains on: the executor's view of
    the batch (``count``, ``first_sample``, ``micro_batch``, ``loss_scale``)."""

    inner: Sharding  # a batch of B / N over the D replicas
    i: int
    N: int

    @classmethod
    def of(cls, shard: Sharding, i: int, n: int) -> PipelineShare:
        return cls(Sharding(shard.global_batch // n, shard.replicas, shard.micro_batch), i, n)

    @property
    def micro_batch(self) -> int:
        return self.inner.micro_batch

    @property
    def micro_batches(self) -> int:
        return self.inner.micro_batches

    @property
    def loss_scale(self) -> float:
        """m / (B / N): model i's loss and gradient are the mean over its share."""
        return self.inner.loss_scale

    def count(self, replica: int) -> int:
        return self.inner.count(replica)

    def first_sample(self, step: int, replica: int, micro: int) -> int:
        share = self.inner.global_batch
        offset = step * share * self.N + self.i * share
        return offset + self.inner.first_sample(0, replica, micro)


@dataclass
class ParallelModel:
    """One parallel model's stage, parameters (by name) and optimizer."""

    stage: Stage
    named: dict[str, nn.Parameter]
    opt: torch.optim.Optimizer
    share: PipelineShare

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [p.detach() for p in self.stage.parameters()]


def parallel_models(
    first: Stage,
    first_opt: torch.optim.Optimizer,
    make_stage,
    training: TrainingSpec,
    shard: Sharding,
    n: int,
) -> list[ParallelModel]:
    """Model 0 is ``first`` (with ``first_opt``); ``make_stage()`` builds each other one,
    which starts from ``first``'s weights with a fresh optimizer."""
    named = dict(first.named_parameters())
    models = [ParallelModel(first, named, first_opt, PipelineShare.of(shard, 0, n))]
    for i in range(1, n):
        stage = make_stage()
        stage.load_state_dict(first.state_dict())
        named = dict(stage.named_parameters())
        opt = build_optimizer(list(named.values()), training)
        models.append(ParallelModel(stage, named, opt, PipelineShare.of(shard, i, n)))
    return models


def reference_stage(first: Stage, make_stage) -> Stage:
    """The reference's partition of this stage: ``first``'s weights, no gradients."""
    stage = make_stage()
    stage.load_state_dict(first.state_dict())
    stage.requires_grad_(False)
    return stage
