"""The Mobius pipeline on one device: S stages swapped through the tier below it.

Mobius (Feng et al., ASPLOS '23) sec. 3.1, with N = 1 device hosting all S stages
(``S > N``). A step runs the stages in the order ``F0 .. F(S-2), FB(S-1), B(S-2)
.. B0``: each stage's M micro-batches forward, in order; the last stage, still
resident, runs forward and backward together; then the others backward in reverse.
Before a stage runs it is uploaded into its reserved buffer (``resident``) while the
previous one computes (``prefetch=True``; without it every transfer is waited for
where it is issued, the no-overlap baseline). A stage's inputs go down to the tier
after its forward and come back for its backward, which recomputes the forward with
the saved RNG state (the paper's checkpoint-and-recompute case, where the
activations moved are the stage boundaries'). Gradients go down after the
backward; the optimizer update of a stage runs on its next upload, before its next
forward (``flush`` applies the last step's), over parameters, gradients and slots
read together, and the updated parameters and slots go back down. A weight tied
across stages (GPT's embedding and head) has its two gradients summed in the tier
at the end of the backward, so both copies take the same update, as in one process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from jobctl.engine.data.dataset import Sharding, TokenData
from jobctl.engine.mobius import memory, resident
from jobctl.engine.mobius.layout import layout_of, slots_of
from jobctl.engine.mobius.tier import FileTier
from jobctl.engine.model.blocks import ModelDef, Stage
from jobctl.engine.runtime.optim import build_optimizer, lr_at, set_lr
from jobctl.engine.runtime.step import autocast, step_seed
from jobctl.spec.sections import TrainingSpec


@dataclass(frozen=True)
class SwapConfig:
    """How a Mobius run swaps: its stages, its tier's folder, prefetch, the budget."""

    folder: Path  # the tier (CPU device): record files under the run's folder
    stages: tuple[tuple[int, ...], ...]  # the blocks of each stage, S >= 2, in order
    micro_batch: int  # m; M = B / m micro-batches per step
    prefetch: bool = True
    budget_bytes: int | None = None  # the device memory the two reserved buffers get


@dataclass
class _Upload:
    """A stage on its way up: which, how, and the handles to wait for."""

    j: int
    mode: str  # "f" forward, "fb" last stage, "b" backward
    update: bool  # parameters, gradients and slots read: the update runs first
    handle: object
    acts: list


class MobiusRunner:
    """Trains a model cut into ``cfg.stages`` on one device through a tier."""

    def __init__(
        self,
        mdef: ModelDef,
        training: TrainingSpec,
        data: TokenData,
        cfg: SwapConfig,
        device: torch.device | None = None,
    ):
        if len(cfg.stages) < 2:
            raise ValueError("a Mobius pipeline needs at least 2 stages (S > N = 1)")
        if mdef.graph is not None:
            raise ValueError("the Mobius runtime runs block models (builtin GPT, hand-cut)")
        self.training, self.data, self.cfg = training, data, cfg
        self.device = device or torch.device("cpu")
        self.shard = Sharding(training.global_batch_size, 1, cfg.micro_batch)
        self.mods, self.opts, self.layouts = [], [], []
        self.tier = self._tier()
        memory.hold_heap()
        for blocks in cfg.stages:  # built one at a time and written down at once
            self._build(mdef, blocks)
        memory.hold_heap()  # the freed build tensors leave; transient ones will too
        self.reserved = resident.Reserved(self._reserve(), self.device)
        self.ties = self._cross_ties(mdef)
        self.pending: int | None = None  # the step whose update is not applied yet
        self.rng: dict[tuple[int, int], torch.Tensor] = {}
        self.traffic = self.tier.traffic
        self.traffic.reset()

    def _build(self, mdef: ModelDef, blocks: tuple[int, ...]) -> None:
        """Stage module, layout and optimizer; its initial weights go down to the tier
        and the module keeps none of them."""
        mod = Stage(mdef, blocks)
        lay = layout_of(mod, slots_of(self.training))
        opt = build_optimizer(list(mod.parameters()), self.training)
        resident.start_counters(mod, opt)
        j = self.tier.add(lay)
        self._wait(self.tier.store(j, resident.pack(mod, lay), [lay.section(0)], ["params"]))
        self.tier.drain()
        resident.release(mod, lay, opt, torch.empty(0, device=self.device))
        self.mods.append(mod.to(self.device))
        self.layouts.append(lay)
        self.opts.append(opt)

    def _reserve(self) -> int:
        """Elements of each reserved buffer; refuses a budget two records overflow."""
        largest = max(lay.nbytes for lay in self.layouts)
        budget = self.cfg.budget_bytes
        if budget is not None and 2 * largest > budget:
            raise ValueError(
                f"two stage records (current + prefetch) need {2 * largest / 2**20:.1f} MiB,"
                f" over the {budget / 2**20:.1f} MiB budget: cut the model into more stages"
            )
        return largest // 4

    def _tier(self):
        if self.device.type == "cuda":
            from jobctl.engine.mobius.pinned import PinnedTier

            return PinnedTier(self.device)
        return FileTier(self.cfg.folder)

    def _cross_ties(self, mdef: ModelDef) -> list[tuple[int, int, int, int, int]]:
        """(stage a, start a, stage b, start b, numel) of each tie across two stages."""
        where = {}
        for j, lay in enumerate(self.layouts):
            for span in lay.spans:
                where[span.name] = (j, lay.section(1)[0] + span.offset * 4, span.numel)
        out = []
        for tie in mdef.ties:
            a, b = where.get(tie.canonical), where.get(tie.alias)
            if a is not None and b is not None and a[0] != b[0]:
                out.append((a[0], a[1], b[0], b[1], a[2]))
        return out

    def close(self) -> None:
        self.tier.close()

    def _wait(self, handle):
        return handle.result()

    def _issued(self, handle):
        """A transfer just issued: without prefetch, wait for it here (no overlap)."""
        if not self.cfg.prefetch:
            handle.result()
        return handle

    def _compute(self):
        return autocast(self.training.precision, self.device)

    def _order(self) -> list[tuple[int, str]]:
        S = len(self.layouts)
        return (
            [(j, "f") for j in range(S - 1)]
            + [(S - 1, "fb")]
            + [(j, "b") for j in range(S - 2, -1, -1)]
        )

    def _upload(self, j: int, mode: str) -> _Upload:
        """Issue stage ``j``'s upload into its buffer (and its inputs, for a backward)."""
        lay = self.layouts[j]
        update = mode != "b" and self.pending is not None
        secs = list(range(lay.sections)) if update else [0]
        kinds = ["params", "grads", *["optim"] * len(lay.slots)] if update else ["params"]
        ranges = [lay.section(k) for k in secs]
        handle = self.tier.load(j, self.reserved.of(j), ranges, kinds[: len(ranges)])
        acts = []
        if mode == "b" and j > 0:
            acts = [self.tier.get_act((j, i)) for i in range(self.shard.micro_batches)]
        return _Upload(j, mode, update, self._issued(handle), acts)

    def _arrive(self, up: _Upload) -> None:
        """Wait for stage ``up.j``, bind it and apply its pending update."""
        j, lay, opt = up.j, self.layouts[up.j], self.opts[up.j]
        flat = self.reserved.of(j)
        self._wait(up.handle)
        resident.bind(self.mods[j], lay, opt, flat, grads=up.update, slots=up.update)
        if up.update:
            set_lr(opt, lr_at(self.pending, self.training))
            opt.step()
            ranges = [lay.section(0)] + [lay.section(2 + k) for k in range(len(lay.slots))]
            kinds = ["params", *["optim"] * len(lay.slots)]
            self._issued(self.tier.store(j, flat, ranges, kinds))
        if up.mode != "f":  # gradients accumulate in the record's gradient section
            flat[lay.section(1)[0] // 4 : lay.section(1)[0] // 4 + lay.n].zero_()
            resident.bind(self.mods[j], lay, opt, flat, grads=True, slots=False)

    def step(self, t: int) -> float:
        """Train step ``t``; returns its global-batch mean loss."""
        torch.manual_seed(step_seed(self.training.seed, t, 0))
        self.tier.new_step()
        m, M = self.shard.micro_batch, self.shard.micro_batches
        batches = [self.data.batch(self.shard.first_sample(t, 0, i), m) for i in range(M)]
        self.tokens = [x.to(self.device) for x, _ in batches]
        self.targets = [y.to(self.device) for _, y in batches]
        order = self._order()
        nxt: _Upload | None = self._upload(*order[0])
        flow, loss = self.tokens, 0.0
        for k, (j, mode) in enumerate(order):
            cur, nxt, more = nxt, None, k + 1 < len(order)
            self._arrive(cur)
            if more and self.cfg.prefetch:  # the next stage comes up while this one runs
                nxt = self._upload(*order[k + 1])
            flow, part = self._run(cur, flow)
            loss += part
            self._down(j, mode)
            if more and nxt is None:
                nxt = self._upload(*order[k + 1])
        self._sum_ties()
        self.pending = t
        return loss

    def _run(self, up: _Upload, flow: list) -> tuple[list, float]:
        if up.mode == "f":
            return self._forward(up.j, flow), 0.0
        if up.mode == "fb":
            return self._last(up.j, flow)
        return self._backward(up.j, flow, up.acts), 0.0

    def _forward(self, j: int, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Stage ``j``'s forward without a graph; its inputs go down (stage 0's are
        the tokens, kept)."""
        outs = []
        for i, x in enumerate(xs):
            if j > 0:
                self._issued(self.tier.put_act((j, i), x))
            self.rng[(j, i)] = torch.get_rng_state()
            with torch.no_grad(), self._compute():
                outs.append(self.mods[j](x))
        return outs

    def _last(self, j: int, xs: list[torch.Tensor]) -> tuple[list, float]:
        """The last stage: forward, loss and backward per micro-batch while resident."""
        grads, loss = [], 0.0
        for i, x in enumerate(xs):
            x = x.detach().requires_grad_(True)
            with self._compute():
                out = self.mods[j](x)
                part = self.mods[j].loss(out, self.targets[i]) * self.shard.loss_scale
            part.backward()
            loss += float(part.detach())
            grads.append(x.grad)
        return grads, loss

    def _backward(self, j: int, grads: list, acts: list) -> list:
        """Stage ``j``'s backward: each input back up, the forward recomputed under its
        saved RNG state, the output gradient propagated; returns the input gradients."""
        out_grads = []
        devices = [self.device] if self.device.type == "cuda" else []
        for i, g in enumerate(grads):
            x = self.tokens[i] if j == 0 else self._wait(acts[i]).requires_grad_(True)
            with torch.random.fork_rng(devices=devices):
                torch.set_rng_state(self.rng.pop((j, i)))
                with self._compute():
                    out = self.mods[j](x)
            torch.autograd.backward(out, g)
            out_grads.append(x.grad if j > 0 else None)
        return out_grads

    def _sum_ties(self) -> None:
        """Sum each cross-stage tie's two gradients in the tier (transfers finished)."""
        self.tier.drain()
        for a, start_a, b, start_b, numel in self.ties:
            ga, gb = torch.empty(numel), torch.empty(numel)
            self.tier.read_span(a, start_a, ga)
            self.tier.read_span(b, start_b, gb)
            ga.add_(gb)
            self.tier.write_span(a, start_a, ga)
            self.tier.write_span(b, start_b, ga)

    def flush(self) -> None:
        """Apply the last step's pending update to every stage."""
        if self.pending is None:
            return
        for j in range(len(self.layouts)):
            up = self._upload(j, "f")
            self._arrive(up)
            resident.release(self.mods[j], self.layouts[j], self.opts[j], self.reserved.placeholder)
            self.tier.drain()
        self.pending = None

    def weights(self) -> dict[str, torch.Tensor]:
        """Every stage's parameters by the unsplit model's names (read from the tier;
        a tie's copies under both names)."""
        out = {}
        for j, lay in enumerate(self.layouts):
            flat = torch.empty(lay.n)
            self.tier.load(j, flat, [(0, lay.n * 4)], ["params"])
            self.tier.drain()
            for span in lay.spans:
                out[span.name] = flat[span.offset : span.offset + span.numel].view(span.shape)
        return out

    def _down(self, j: int, mode: str) -> None:
        """Gradients down after a backward; the stage leaves its buffer."""
        lay = self.layouts[j]
        if mode != "f":
            self._issued(self.tier.store(j, self.reserved.of(j), [lay.section(1)], ["grads"]))
        resident.release(self.mods[j], lay, self.opts[j], self.reserved.placeholder)
