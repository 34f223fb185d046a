"""The Mobius pipeline: S stages on N ranks (S > N), swapped through the tier below.

Mobius (Feng et al., ASPLOS '23) sec. 3.1. Stage j runs on rank ``j % N`` or where
``SwapConfig.placement`` (a sec. 3.3 cross mapping) puts it (``links``);
a step runs the stages in one global order, ``F0 .. F(S-2), FB(S-1), B(S-2) .. B0``,
each rank its own ones: a stage's M micro-batches forward, in order, each as soon as
its input arrives; the last stage, still resident, forward and backward together;
then the others backward in reverse. Before a stage runs it is uploaded into its
reserved buffer (``resident``) while the rank's previous stage computes
(``prefetch=True``; without it every transfer is waited for where it is issued, the
no-overlap baseline). A stage's inputs go down to the tier after its forward and
come back for its backward, which recomputes the forward under the saved RNG state
(the paper's checkpoint-and-recompute case: the activations moved are the stage
boundaries'). Gradients go down after the backward (fp16: unscaled first; an
overflow anywhere skips the step's update on every rank); a stage's optimizer update
runs on its next upload, before its next forward (``flush`` applies the last step's),
over parameters, gradients and slots read together, and the updated parameters and
slots go back down. A weight tied across stages (GPT's embedding and head) has its
two gradients summed at the end of the backward, so both copies take the same
update, as in one process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from jobctl.engine.data.dataset import Sharding, TokenData
from jobctl.engine.mobius import masks, memory, resident
from jobctl.engine.mobius.layout import layout_of, slots_of
from jobctl.engine.mobius.links import Links, round_robin
from jobctl.engine.mobius.tier import FileTier
from jobctl.engine.model.blocks import ModelDef, Stage
from jobctl.engine.model.graph import boundary
from jobctl.engine.runtime import rng
from jobctl.engine.runtime.loss_scale import LossScaler
from jobctl.engine.runtime.optim import build_optimizer, lr_at, set_lr
from jobctl.engine.runtime.step import autocast, step_seed
from jobctl.spec.sections import TrainingSpec


@dataclass(frozen=True)
class SwapConfig:
    """How a Mobius run swaps: its stages, its tier's folder, prefetch, the budget."""

    folder: Path  # the tier (CPU device): record files under rank-<r>/
    stages: tuple[tuple[int, ...], ...]  # the blocks of each stage, in order
    micro_batch: int  # m; M = B / m micro-batches per step
    prefetch: bool = True
    budget_bytes: int | None = None  # the device memory the two reserved buffers get
    rank: int = 0  # this rank, of
    world: int = 1  # N ranks (a process group joins them when N > 1)
    placement: tuple[int, ...] | None = None  # the rank of each stage (None: j % N)

    def ranks(self) -> tuple[int, ...]:
        """The rank of each stage; every rank hosts at least one."""
        got = self.placement or round_robin(len(self.stages), self.world)
        if len(got) != len(self.stages) or set(got) != set(range(self.world)):
            raise ValueError(
                f"placement {got} must give each of the {len(self.stages)} stages one of "
                f"ranks 0..{self.world - 1}, every rank at least one stage"
            )
        return tuple(got)


@dataclass
class _Upload:
    """A stage on its way up: which, how, and the handles to wait for."""

    j: int
    mode: str  # "f" forward, "fb" last stage, "b" backward
    update: bool  # parameters, gradients and slots read: the update runs first
    handle: object
    acts: list


class MobiusRunner:
    """Trains this rank's stages of a model cut into ``cfg.stages`` through a tier."""

    def __init__(
        self,
        mdef: ModelDef,
        training: TrainingSpec,
        data: TokenData,
        cfg: SwapConfig,
        device: torch.device | None = None,
        group=None,
        scaler: LossScaler | None = None,
    ):
        if len(cfg.stages) <= cfg.world:
            raise ValueError(f"a Mobius pipeline has more stages than ranks (S > N = {cfg.world})")
        self.training, self.data, self.cfg, self.scaler = training, data, cfg, scaler
        self.device = device or torch.device("cpu")
        self.found_inf = False  # fp16: an overflow in this rank's gradients this step
        self.shard = Sharding(training.global_batch_size, 1, cfg.micro_batch)
        self.S = len(cfg.stages)
        self.placement = cfg.ranks()
        self.mine = [j for j in range(self.S) if self.placement[j] == cfg.rank]
        self.mods, self.opts, self.layouts, self.pruned = {}, {}, {}, {}  # pruned: masks.py
        self.tier = self._tier()
        # Tuning the heap is process-wide: only a rank held to a budget owns its
        # process that far (a test or a notebook running the runtime in-process does not).
        held = cfg.budget_bytes is not None
        if held:
            memory.hold_heap()
        for j in self.mine:  # built one at a time and written down at once
            self._build(mdef, j)
        if held:  # the freed build tensors leave; transient ones will too
            memory.hold_heap()
        self.reserved = resident.Reserved(self._reserve(), self.device)
        self.links = Links(cfg.rank, self.placement, self.shard.micro_batches, group)
        self.ties = self._cross_ties(mdef)
        self.pending: int | None = None  # the step whose update is not applied yet
        self.rng: dict[tuple[int, int], rng.RngState] = {}
        self.offloaded: set[int] = set()  # stages whose inputs are down, not yet asked up
        self.described: set[int] = set()  # traced stages whose carrier layout went on
        self.kw: list[dict | None] = []  # each micro-batch's model inputs (traced models)
        self.traffic = self.tier.traffic
        self.traffic.reset()

    def _build(self, mdef: ModelDef, j: int) -> None:
        """Stage module, layout and optimizer; its initial weights go down to the tier
        and the module keeps none of them."""
        mod = Stage(mdef, self.cfg.stages[j])
        lay = layout_of(mod, slots_of(self.training))
        opt = build_optimizer(list(mod.parameters()), self.training)
        resident.start_counters(mod, opt)
        self.tier.add(j, lay)
        self.tier.store(j, resident.pack(mod, lay), [lay.section(0)], ["params"]).result()
        self.tier.drain()
        resident.release(mod, lay, opt, torch.empty(0, device=self.device))
        self.mods[j], self.layouts[j], self.opts[j] = mod.to(self.device), lay, opt

    def _reserve(self) -> int:
        """Elements of each reserved buffer; refuses a budget two records overflow."""
        largest = max(lay.nbytes for lay in self.layouts.values())
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
        return FileTier(self.cfg.folder / f"rank-{self.cfg.rank}")  # ranks may share it

    def _cross_ties(self, mdef: ModelDef) -> list[tuple[int, int, int, int]]:
        """(my stage, byte start of its gradient, other stage, numel) of each tie
        across two stages that one of this rank's stages holds."""
        stage_of = {b: j for j, blocks in enumerate(self.cfg.stages) for b in blocks}
        out = []
        for tie in mdef.ties:
            a, b = (stage_of[int(n.split(".")[1])] for n in (tie.canonical, tie.alias))
            for mine, name, other in ((a, tie.canonical, b), (b, tie.alias, a)):
                if a != b and mine in self.layouts:
                    lay = self.layouts[mine]
                    span = lay.span(name)
                    out.append((mine, lay.section(1)[0] + span.offset * 4, other, span.numel))
        return out

    def close(self) -> None:
        self.links.drain()
        self.tier.close()

    def _issued(self, handle):
        """A transfer just issued: without prefetch, wait for it here (no overlap)."""
        if not self.cfg.prefetch:
            handle.result()
        return handle

    def _compute(self):
        return autocast(self.training.precision, self.device)

    def _order(self) -> list[tuple[int, str]]:
        """This rank's stages in the step's global order."""
        S = self.S
        order = [(j, "f") for j in range(S - 1)] + [(S - 1, "fb")]
        order += [(j, "b") for j in range(S - 2, -1, -1)]
        return [(j, mode) for j, mode in order if j in self.layouts]

    def _buffer(self, j: int) -> torch.Tensor:
        return self.reserved.of(self.mine.index(j))

    def _upload(self, j: int, mode: str) -> _Upload:
        """Issue stage ``j``'s upload into its buffer (and its inputs, for a backward)."""
        lay = self.layouts[j]
        update = mode != "b" and self.pending is not None
        secs = range(lay.sections) if update else [0]
        kinds = ["params", "grads", *["optim"] * len(lay.slots)]
        ranges = [lay.section(k) for k in secs]
        handle = self._issued(self.tier.load(j, self._buffer(j), ranges, kinds[: len(ranges)]))
        if update:  # the update on upload, right behind the read
            step, read = self.pending, handle
            handle = self._issued(self.tier.after(lambda: self._update(j, step, read)))
        up = _Upload(j, mode, update, handle, [])
        if mode == "b" and j in self.offloaded:  # else issued on arrival, once offloaded
            up.acts = self._fetch_inputs(j)
        return up

    def _fetch_inputs(self, j: int) -> list:
        """Issue the uploads of stage ``j``'s offloaded inputs (after their offload)."""
        self.offloaded.discard(j)
        return [self.tier.get_act((j, i)) for i in range(self.shard.micro_batches)]

    def _arrive(self, up: _Upload) -> None:
        """Wait for stage ``up.j`` (and its update) and bind it for its run."""
        j, lay, opt = up.j, self.layouts[up.j], self.opts[up.j]
        stored = up.handle.result()  # an update's handle yields its store's
        if stored is not None and not self.cfg.prefetch:
            stored.result()
        if up.mode == "b" and j > 0 and not up.acts:
            up.acts = self._fetch_inputs(j)
        flat = self._buffer(j)
        resident.bind(self.mods[j], lay, opt, flat, grads=False, slots=False)
        if up.mode != "f":  # gradients accumulate in the record's gradient section
            flat[lay.n : 2 * lay.n].zero_()
            resident.bind(self.mods[j], lay, opt, flat, grads=True, slots=False)

    def _update(self, j: int, step: int, read):
        """Stage ``j``'s update with step ``step``'s gradients, in its record once
        ``read`` is (on the tier's I/O thread for a file tier, so the training thread
        computes meanwhile); issues the store of parameters and slots, returns its
        handle."""
        read.result()
        lay, opt, flat = self.layouts[j], self.opts[j], self._buffer(j)
        resident.bind(self.mods[j], lay, opt, flat, grads=True, slots=True)
        set_lr(opt, lr_at(step, self.training))
        masks.zero(self.pruned, lay, flat, 1)  # pruned stay pruned (mobius.masks)
        opt.step()
        masks.zero(self.pruned, lay, flat, 0)
        ranges = [lay.section(0)] + [lay.section(2 + k) for k in range(len(lay.slots))]
        return self.tier.store(j, flat, ranges, ["params", *["optim"] * len(lay.slots)])

    def step(self, t: int) -> float | None:
        """Train step ``t``; returns its global-batch mean loss on the rank of the last
        stage (None elsewhere)."""
        torch.manual_seed(step_seed(self.training.seed, t, 0))
        self.tier.new_step()
        self._load([self.shard.first_sample(t, 0, i) for i in range(self.shard.micro_batches)])
        order = self._order()
        nxt: _Upload | None = self._upload(*order[0])
        loss = None
        for k, (j, mode) in enumerate(order):
            cur, nxt, more = nxt, None, k + 1 < len(order)
            self._arrive(cur)
            if more and self.cfg.prefetch:  # the next stage comes up while this one runs
                nxt = self._upload(*order[k + 1])
            part = self._run(cur)
            loss = part if part is not None else loss
            self._down(j, mode)
            if more and nxt is None:
                nxt = self._upload(*order[k + 1])
        self._sum_ties()
        self.links.drain()
        # fp16: an overflow anywhere skips the step's update on every rank (S moves alike)
        self.pending = None if self._overflowed() else t
        return loss

    def _overflowed(self) -> bool:
        """fp16: the world's found-inf flag of this step (a MAX over the ranks), S moved
        by it (``runtime.loss_scale``'s rule); False without a loss scale."""
        if self.scaler is None:
            return False
        flag = torch.tensor([int(self.found_inf)], dtype=torch.int32)
        if self.cfg.world > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.links.group)
        self.found_inf = False
        self.scaler.update(bool(flag.item()))
        return self.scaler.skipped

    def _load(self, firsts: list[int], data=None) -> None:  # noqa: ANN001 - Samples
        """The tokens, targets and (a traced model's) keyword inputs of the micro-batches
        starting at ``firsts``: every stage reads its own (masks, positions)."""
        m, mod = self.shard.micro_batch, self.mods[self.mine[0]]
        data = self.data if data is None else data
        batches = [data.batch(f, m) for f in firsts]
        self.tokens = [x.to(self.device) for x, _ in batches]
        self.targets = [y.to(self.device) for _, y in batches]
        loaded = zip(self.tokens, self.targets, firsts, strict=True)
        self.kw = [mod.batch(x, y, f) for x, y, f in loaded]

    def _run(self, up: _Upload) -> float | None:
        if up.mode == "f":
            self._forward(up.j)
            return None
        if up.mode == "fb":
            return self._last(up.j)
        self._backward(up.j, up.acts)
        return None

    def _input(self, j: int, i: int) -> torch.Tensor:
        if j == 0:
            return self.tokens[i]
        graph = self.mods[j].graph
        if graph is not None and graph.in_boundary is None:  # sent before the first input
            graph.in_boundary = boundary.decode(self.links.recv("m", j, 0, j - 1, "cpu").tolist())
        return self.links.recv("a", j, i, j - 1, self.device)

    def _send_out(self, j: int, i: int, out: torch.Tensor) -> None:
        """Stage ``j``'s output of micro-batch ``i`` on to stage j + 1 (a traced
        carrier's layout first, once)."""
        graph = self.mods[j].graph
        if graph is not None and j not in self.described:
            ints = torch.tensor(boundary.encode(graph.out_boundary), dtype=torch.int64)
            self.links.send("m", j + 1, 0, ints)
            self.described.add(j)
        self.links.send("a", j + 1, i, out)

    def _forward(self, j: int) -> None:
        """Stage ``j``'s forward without a graph, micro-batch by micro-batch; its inputs
        go down (stage 0's are the tokens, kept) and its outputs on."""
        for i in range(self.shard.micro_batches):
            x = self._input(j, i)
            if j > 0:
                self._issued(self.tier.put_act((j, i), x))
            self.rng[(j, i)] = rng.capture(self.device)
            with torch.no_grad(), self._compute():
                self._send_out(j, i, self.mods[j](x, self.kw[i]))
        if j > 0:
            self.offloaded.add(j)

    def _last(self, j: int) -> float:
        """The last stage: forward, loss and backward per micro-batch while resident."""
        loss = 0.0
        for i in range(self.shard.micro_batches):
            x = self._input(j, i).detach().requires_grad_(True)
            with self._compute():
                out = self.mods[j](x, self.kw[i])
                part = self.mods[j].loss(out, self.targets[i], self.kw[i]) * self.shard.loss_scale
            (part if self.scaler is None else self.scaler.scaled(part)).backward()
            loss += float(part.detach())
            self.links.send("g", j - 1, i, x.grad)
        return loss

    def _backward(self, j: int, acts: list) -> None:
        """Stage ``j``'s backward: each input back up, the forward recomputed under its
        saved RNG state, the output's gradient propagated, the input's sent back."""
        for i in range(self.shard.micro_batches):
            g = self.links.recv("g", j, i, j + 1, self.device)
            x = self.tokens[i] if j == 0 else acts[i].result().requires_grad_(True)
            with rng.replayed(self.rng.pop((j, i))), self._compute():
                out = self.mods[j](x, self.kw[i])
            torch.autograd.backward(out, g)
            if j > 0:
                self.links.send("g", j - 1, i, x.grad)

    def _down(self, j: int, mode: str) -> None:
        """Gradients down after a backward (fp16: unscaled first, overflows noted); the
        stage leaves its buffer."""
        lay = self.layouts[j]
        if mode != "f" and self.scaler is not None:  # 1 / S is exact: ties sum as well
            self.found_inf |= self.scaler.unscale(list(self.mods[j].parameters()))
        if mode != "f":
            self._issued(self.tier.store(j, self._buffer(j), [lay.section(1)], ["grads"]))
        resident.release(self.mods[j], lay, self.opts[j], self.reserved.placeholder)

    def _sum_ties(self) -> None:
        """Sum each cross-stage tie's two gradients where they lie (in this rank's
        tier, or one here and one on the other stage's rank), canonical + alias on
        both sides, so both copies hold the same bits."""
        self.tier.drain()
        here = {}
        for mine, start, _, numel in self.ties:
            here[mine] = (start, torch.empty(numel))
            self.tier.read_span(mine, start, here[mine][1])
        for mine, start, other, _ in self.ties:
            g = here[mine][1]
            if other in here:
                theirs = here[other][1]
            else:
                theirs = self.links.exchange(self.placement[other], g)
            total = g + theirs if mine < other else theirs + g
            self.tier.write_span(mine, start, total)

    def flush(self) -> None:
        """Apply the last step's pending update to every stage of this rank."""
        if self.pending is None:
            return
        for j in self.mine:
            self._arrive(self._upload(j, "f"))
            resident.release(self.mods[j], self.layouts[j], self.opts[j], self.reserved.placeholder)
            self.tier.drain()
        self.pending = None

    def evaluate(self, data) -> float | None:  # noqa: ANN001 - Samples (the eval split)
        """The mean loss of the batch ``[0, B)`` of ``data`` (the validation split), forward
        only, after the last step's update: each stage up once in the global order, its
        M micro-batches through, its outputs on; the loss on the last stage's rank
        (None elsewhere). Nothing is offloaded: no backward follows."""
        self.flush()
        self._load(
            [self.shard.first_sample(0, 0, i) for i in range(self.shard.micro_batches)], data
        )
        loss = None
        for j in self.mine:
            self._arrive(self._upload(j, "f"))
            self.mods[j].eval()
            with torch.no_grad(), self._compute():
                for i, y in enumerate(self.targets):
                    out = self.mods[j](self._input(j, i), self.kw[i])
                    if j < self.S - 1:
                        self._send_out(j, i, out)
                    else:
                        part = self.mods[j].loss(out, y, self.kw[i]) * self.shard.loss_scale
                        loss = (loss or 0.0) + float(part)
            self.mods[j].train()
            self._down(j, "f")
        self.links.drain()
        return loss

    def weights(self) -> dict[str, torch.Tensor]:
        """This rank's stages' parameters by the unsplit model's names (read from the
        tier; a tie's copies under both names)."""
        out = {}
        for j, lay in self.layouts.items():
            flat = torch.empty(lay.n)
            self.tier.load(j, flat, [(0, lay.n * 4)], ["params"])
            self.tier.drain()
            for span in lay.spans:
                out[span.name] = flat[span.offset : span.offset + span.numel].view(span.shape)
        return out
