"""Execute one stage's action list for one training step.

``F`` runs the stage's blocks on a micro-batch (the tokens on stage 0, the received
activation elsewhere) and sends the output on; a forward whose micro-batch is
recomputed later keeps only its input and the RNG state (no autograd graph). ``R``
restores that RNG state and re-runs the forward with autograd, so recompute is
bit-identical to keeping the activations. ``B`` back-propagates the received gradient
(or the loss, on the last stage) and sends the input gradient back. On a stage whose
list has ``W`` actions (zero bubble), ``B`` computes only the input gradient and
``W`` the weight gradients later (``backward``); the graph is held until ``W``.

With ``opportunistic=True`` (Varuna sec. 3.2) a stage whose next action is a backward
still waiting for its gradient runs the next forward instead, if that forward's input
is ready and the schedule's activation bound and rule 2 allow it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from jobctl.engine.core.actions import Action, Op, recomputed, weight_follows, weight_split
from jobctl.engine.data.dataset import Sharding, TokenData
from jobctl.engine.model.blocks import Stage
from jobctl.engine.runtime import rng
from jobctl.engine.runtime.backward import (
    WeightStore,
    defer_linear_weights,
    input_grads,
    weight_grads,
)
from jobctl.engine.runtime.p2p.gloo import Inbox, Outbox
from jobctl.engine.runtime.p2p.shm import ShmInbox, ShmOutbox
from jobctl.engine.runtime.topology import Topology
from jobctl.engine.schedule.checks import ActivationPeak, peak_activations


@dataclass
class StepStats:
    """What one step measured on this rank."""

    # The last stage's loss sum stays on the device (float64) until the step's commit
    # reads it: a float() per micro-batch would drain a GPU's queue before each backward.
    loss_sum: float | torch.Tensor = 0.0
    fwd_s: list[float] = field(default_factory=list)
    bwd_s: list[float] = field(default_factory=list)
    order: list[Action] = field(default_factory=list)
    deviations: int = 0


@dataclass
class Channels:
    """This rank's shapes and message boxes for one step."""

    in_shape: tuple | None
    in_dtype: torch.dtype | None
    out_shape: tuple | None
    out_dtype: torch.dtype | None


class StepExecutor:
    """Runs one step of one stage's schedule with real point-to-point traffic."""

    def __init__(
        self,
        stage: Stage,
        topo: Topology,
        data: TokenData,
        shard: Sharding,
        chans: Channels,
        device: torch.device,
        opportunistic: bool = False,
        links: dict | None = None,
    ):
        self.stage, self.topo, self.data, self.shard = stage, topo, data, shard
        self.chans, self.device, self.opportunistic = chans, device, opportunistic
        # Shared-memory links to same-machine neighbours (engine/runtime/p2p/shm.py); a peer
        # without one is reached through the process group.
        self.links = links or {}
        # fp16's loss scale (runtime.loss_scale.LossScaler; the trainer sets it): the
        # last stage's backward root is each loss times S, so every stage's gradients
        # arrive scaled through the boundaries.
        self.scaler = None

    def close(self) -> None:
        """Give up the shared-memory links (a rebalanced pipeline gets new ones)."""
        for link in self.links.values():
            if link is not None:
                link.close()
        self.links = {}

    def run(self, actions: list[Action], step: int) -> StepStats:
        """Execute ``actions`` for training step ``step``; returns measurements."""
        actions = self.begin(actions, step)
        stats = StepStats()
        for action in self._ordered(actions, stats):
            self._do(action, stats)
            stats.order.append(action)
        self.finish()
        return stats

    def begin(self, actions: list[Action], step: int, fuse: bool = True) -> list[Action]:
        """Open step ``step``'s message boxes; returns the actions this replica runs
        (``run``, or a rank hosting two stages, ``two_stage``, runs them with ``_do``).
        ``fuse``: on the first stage, a B whose W follows it directly runs as one
        whole backward (see ``_fused``)."""
        self.step = step
        # Any D: this replica may run fewer micro-batches than the schedule's M. Every
        # stage of a replica drops the same ones, so the pipeline stays consistent.
        mine = self.shard.count(self.topo.replica)
        actions = [a for a in actions if a.micro_batch < mine]
        fused = self._fused(actions) if fuse else set()
        actions = [a for a in actions if not (a.op is Op.WEIGHT and a.micro_batch in fused)]
        self.rec, self.split = recomputed(actions), weight_split(actions)
        if self.split:  # linear layers leave their weight gradients to W
            self.weights = WeightStore()
            deferred = defer_linear_weights(self.stage, self.weights)
            self.in_b = [p for p in self.stage.parameters() if p not in deferred]
        fwd_order = [a.micro_batch for a in actions if a.op is Op.FORWARD]
        bwd_order = [a.micro_batch for a in actions if a.op is Op.BACKWARD]
        window = max(2, self.topo.P)
        t, c = self.topo, self.chans
        prev, nxt = self.links.get(t.prev), self.links.get(t.next)
        self.acts_in = self.grads_out = self.grads_in = self.acts_out = None
        if prev is not None:
            self.acts_in, self.grads_out = ShmInbox(prev.into, fwd_order), ShmOutbox(prev.out)
        elif t.prev is not None:
            self.acts_in = Inbox(t.prev, c.in_shape, c.in_dtype, self.device, 0, fwd_order, window)
            self.grads_out = Outbox(t.prev, 1)
        if nxt is not None:
            self.grads_in, self.acts_out = ShmInbox(nxt.into, bwd_order), ShmOutbox(nxt.out)
        elif t.next is not None:
            self.grads_in = Inbox(
                t.next, c.out_shape, c.out_dtype, self.device, 1, bwd_order, window
            )
            self.acts_out = Outbox(t.next, 0)
        self.saved: dict[int, dict] = {}
        return actions

    def _fused(self, actions: list[Action]) -> set[int]:
        """Micro-batches whose B and W run as one backward: on the first stage no
        stage waits for an input gradient, so a W right after its B (ZB-H1's first
        stage, every micro-batch) only pays the split's per-layer Python costs. The
        arithmetic is the same either way; the stage's time is B's plus W's."""
        return weight_follows(actions) if self.topo.prev is None else set()

    def finish(self) -> None:
        """Wait until this step's sends have left."""
        for box in (self.acts_out, self.grads_out):
            if box is not None:
                box.drain()

    def _ordered(self, actions: list[Action], stats: StepStats):
        """Yield actions in schedule order, deviating opportunistically if enabled.

        The deviation point is the backward task: before an ``R(i)`` runs, or at a
        ``B(i)`` without recompute. Once ``R(i)`` has run, only ``B(i)`` may follow
        (Varuna rule 2), and a pulled-ahead forward must keep the stage within its
        schedule's own full and stashed activation peaks.
        """
        pending = list(actions)
        peak = peak_activations(actions)
        while pending:
            k = 0
            if self.opportunistic and self._waits_for_gradient(pending[0]):
                k = self._ready_forward(pending, peak)
                stats.deviations += k > 0
            yield pending.pop(k)

    def _waits_for_gradient(self, a: Action) -> bool:
        backward_task = a.op is Op.RECOMPUTE or (
            a.op is Op.BACKWARD and a.micro_batch not in self.rec
        )
        return (
            backward_task and self.grads_in is not None and not self.grads_in.ready(a.micro_batch)
        )

    def _ready_forward(self, pending: list[Action], peak: ActivationPeak) -> int:
        """Index of the next forward that may run now, or 0 to keep the schedule."""
        k = next((k for k, a in enumerate(pending) if a.op is Op.FORWARD), None)
        if k is None:
            return 0
        i = pending[k].micro_batch
        if self.acts_in is not None and not self.acts_in.ready(i):
            return 0
        full = sum(1 for v in self.saved.values() if v.get("graph"))
        stashed = len(self.saved) - full
        fits = stashed < peak.stashed if i in self.rec else full < peak.full
        return k if fits else 0

    def _do(self, a: Action, stats: StepStats) -> None:
        """Run one action; its compute time (not waits for peers) goes into ``stats``."""
        if a.op is Op.FORWARD:
            stats.fwd_s.append(self._forward(a.micro_batch))
        elif a.op is Op.RECOMPUTE:
            t0 = time.perf_counter()
            self._recompute(a.micro_batch)
            stats.fwd_s.append(time.perf_counter() - t0)
        elif a.op is Op.WEIGHT:
            t0 = time.perf_counter()
            weight_grads(self.weights, a.micro_batch)
            del self.saved[a.micro_batch]
            stats.bwd_s.append(time.perf_counter() - t0)
        else:
            loss, seconds = self._backward(a.micro_batch)
            stats.loss_sum += loss
            stats.bwd_s.append(seconds)

    def _inputs(self, i: int) -> tuple[torch.Tensor, torch.Tensor | None, dict | None]:
        """Micro-batch ``i``'s stage input, targets (last stage) and, for a traced
        model, its keyword arguments (on every stage whose subgraphs read them)."""
        first = self.shard.first_sample(self.step, self.topo.replica, i)
        graph = self.stage.graph
        need_tokens = self.topo.is_first or self.topo.is_last
        batch = None
        if need_tokens or (graph is not None and graph.needs_batch):
            x, y = self.data.batch(first, self.shard.micro_batch)
            x, y = x.to(self.device), y.to(self.device)
            batch = self.stage.batch(x, y, first)
        if not self.topo.is_first:
            x = self.acts_in.take(i)
        return x, (y if self.topo.is_last else None), batch

    def _forward(self, i: int) -> float:
        x, y, batch = self._inputs(i)
        t0 = time.perf_counter()
        if i in self.rec:
            state = rng.capture(self.device)  # the device's generator too, on a GPU
            with torch.no_grad():
                out = self.stage(x, batch)
            self.saved[i] = {"x": x, "y": y, "batch": batch, "rng": state}
        else:
            out = self._graph_forward(i, x, y, batch)
        seconds = time.perf_counter() - t0
        if self.acts_out is not None:
            self.acts_out.send(i, out.detach())
        return seconds

    def _graph_forward(
        self, i: int, x: torch.Tensor, y: torch.Tensor | None, batch: dict | None
    ) -> torch.Tensor:
        if x.is_floating_point():
            x.requires_grad_(True)
        if i in self.split:  # its linear layers record what B and W need
            self.weights.recording = i
        try:
            out = self.stage(x, batch)
        finally:
            if self.split:
                self.weights.recording = None
        last = self.topo.is_last
        loss = self.stage.loss(out, y, batch) * self.shard.loss_scale if last else None
        self.saved[i] = {"x": x, "out": out, "loss": loss, "graph": True}
        return out

    def _recompute(self, i: int) -> None:
        s = self.saved.pop(i)
        with rng.replayed(s["rng"]):
            self._graph_forward(i, s["x"], s["y"], s["batch"])

    def _backward(self, i: int) -> tuple[float | torch.Tensor, float]:
        """Back-propagate micro-batch ``i``; returns (its loss share, compute seconds).

        A split backward (``i`` has a W) computes the input gradient (and the
        gradients of weights outside linear layers) and frees the graph; the linear
        layers' inputs and output gradients wait in ``self.weights`` for W(i), and
        ``saved[i]`` marks the micro-batch as held until then.
        """
        s = self.saved.pop(i)
        grad = None if self.topo.is_last else self.grads_in.take(i)
        out = s["loss"] if grad is None else s["out"]
        if grad is None and self.scaler is not None:
            out = self.scaler.scaled(out)
        loss = s["loss"].detach().double() if grad is None else 0.0  # no sync: StepStats
        t0 = time.perf_counter()
        if i in self.split:
            input_grads(out, grad, s["x"], self.in_b, self.weights, i)
            self.saved[i] = {"graph": True}
        elif grad is None:
            out.backward()
        else:
            torch.autograd.backward(out, grad)
        seconds = time.perf_counter() - t0
        if self.grads_out is not None:
            self.grads_out.send(i, s["x"].grad)
        return loss, seconds
