"""One rank of AvgPipe's profiling phase (sec. 5.2.1): the stage of the profiled
setting (a large M, a small N) trained for ``BATCHES`` batches with the runtime's own
parts: the step executor over shared-memory links, the N pipelines interleaved on
their parallel models (``interleave``), each model's optimizer step, local update,
pull and send to the reference thread (``rule``, ``reference``), as
``AveragingEngine`` runs them (one replica: the gradient all-reduce is not profiled;
each update right after its pipeline's last backward, ``interleave.on_done``).

It records per batch each computing action's seconds (the executor's own timing of
its forward, backward, recompute or W), the seconds of this rank's sends, and the
seconds of the N updates; then the stage's peak per-sample rate (a forward and
backward of the largest micro-batch, B / D samples) and the bytes autograd saves per
sample. Utilisation on a CPU (``phi``): an action's achieved samples per second as a
fraction of that peak rate. The busy fraction of the process's cores would say
nothing here: a rank computes on its threads without pause during an action, at any
micro-batch size; what a small micro-batch loses is work per second (per-operator
overheads), which this fraction measures (the paper's GPU utilisation, read by
nvidia-smi, has a fixed 100 %; this one is measured on the same stage).

And the stage alone at each candidate's micro-batch size (``job["sizes"]``, B / (D
N M) over the settings the tuner predicts): a forward and backward, at least
``SIZE_REPEATS`` times each, the sizes taken in turn before each profiled batch, so
that they see the same load as the batches on a shared host (timed after them, a
neighbour's job starting made them twice as slow as the batches); ``timed``:
[size, median seconds]. ``averaging.planning.tuning`` takes the computation at another
size from these instead of eq. 2's assumption that a larger micro-batch only raises
the utilisation (a CPU rank's fixed cost per micro-batch, Python and small GEMMs'
efficiency, is what a larger one saves).
"""

from __future__ import annotations

import json
import os
import pickle
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from jobctl.engine.averaging.interleave import InterleavedExecutor, InterleavedShare
from jobctl.engine.averaging.models import parallel_models, reference_stage
from jobctl.engine.averaging.reference import ReferenceModel
from jobctl.engine.averaging.rule import dilute, local_update
from jobctl.engine.core.actions import Action
from jobctl.engine.data.dataset import Sharding, make_data
from jobctl.engine.model.blocks import Stage, model_def
from jobctl.engine.runtime.executor import StepExecutor, StepStats
from jobctl.engine.runtime.optim import build_optimizer, lr_at, set_lr
from jobctl.engine.runtime.p2p.shm import connect_neighbours, poll_where_cores_allow
from jobctl.engine.runtime.step import probe_channels
from jobctl.engine.runtime.topology import Topology
from jobctl.engine.schedule.checks import peak_activations

BATCHES = 20  # the paper's twenty batches
WARMUP = 3
PEAK_REPEATS = 3
SIZE_REPEATS = 3  # at least, each candidate size, spread over the BATCHES


class ProfiledExecutor(InterleavedExecutor):
    """An :class:`InterleavedExecutor` that times this rank's sends."""

    sent_s: list[float]  # forward activations, backward gradients

    def begin(self, actions: list[Action], step: int) -> list[Action]:
        actions = super().begin(actions, step)
        self.sent_s = [0.0, 0.0]
        for k, box in enumerate((self.acts_out, self.grads_out)):
            if box is not None:
                box.send = self._timed(box.send, k)
        return actions

    def _timed(self, send, k: int):
        def timed(i: int, t: torch.Tensor) -> None:
            t0 = time.perf_counter()
            send(i, t)
            self.sent_s[k] += time.perf_counter() - t0

        return timed


def topology(rank: int, P: int) -> Topology:
    """Rank ``rank`` of one P-stage pipeline (one replica, no tied group)."""
    return Topology(
        rank=rank,
        stage=rank,
        replica=0,
        P=P,
        D=1,
        prev=None if rank == 0 else rank - 1,
        next=None if rank == P - 1 else rank + 1,
        dp_ranks=[rank],
        dp_group=None,
        tied_ranks=[],
        tied_group=None,
    )


def profile_rank(rank: int, job: dict) -> dict:
    """This rank's profile: see the module docstring; ``job`` holds the spec, each
    stage's blocks and action list, N, the micro-batch size and B / D."""
    spec, P, n, size, B = job["spec"], job["P"], job["N"], job["size"], job["B"]
    mdef = model_def(spec.model, spec.training.seed, size)

    def make_stage() -> Stage:
        return Stage(mdef, job["blocks"][rank], job["keep"][rank])

    stage = make_stage()
    opt = build_optimizer(list(stage.parameters()), spec.training)
    topo, cpu = topology(rank, P), torch.device("cpu")
    chans = probe_channels(stage, topo, size, spec.model.seq_len, cpu)
    actions = job["actions"][rank]
    links = connect_neighbours(topo, chans, cpu, lambda peer: True, 300.0, B // size)
    poll_where_cores_allow(links, P)
    shard = Sharding(B, 1, size)
    ex = StepExecutor(stage, topo, make_data(spec), shard, chans, cpu, links=links)
    models = parallel_models(stage, opt, make_stage, spec.training, shard, n)
    ref = ReferenceModel(reference_stage(stage, make_stage), n)
    share = InterleavedShare(B, 1, size, N=n)
    iex = ProfiledExecutor(ex, [m.stage for m in models], share)
    try:
        timer = SizeTimer(stage, topo, chans, make_data(spec), job["sizes"])
        out = _batches(iex, actions, models, ref, spec.training, 1.0 / n, timer)
    finally:
        ref.close(check=False)
        ex.close()
    out.update(_memory(models, ref.stage))
    out.update(_peak(stage, topo, chans, make_data(spec), B))
    out["timed"] = timer.timed()
    out["peak"] = peak_activations(actions).full
    out["size"] = size
    return out


def _batches(iex, actions, models, ref, training, alpha: float, timer) -> dict:
    """``BATCHES`` batches after ``WARMUP``: per batch, the computing actions'
    (kind, seconds), the sends' seconds and the N updates' seconds (each run, as
    ``AveragingEngine`` runs it with D = 1, right after its pipeline's last backward);
    before each, ``timer``'s stage-alone passes (before: the batch's gradients stay
    for ``_memory``)."""
    acts, sent, upd = [], [], []
    for step in range(WARMUP + BATCHES):
        if step >= WARMUP - 1:
            timer.run(warm=step < WARMUP)
        for model in models:
            model.opt.zero_grad(set_to_none=True)
        spent = [0.0]

        def update(i: int, step: int = step, spent: list = spent) -> None:
            t0 = time.perf_counter()
            _update(models[i], ref, step, training, alpha)
            spent[0] += time.perf_counter() - t0

        iex.on_done = update
        stats = iex.run(actions, step)
        if step >= WARMUP:
            upd.append(spent[0])
            acts.append(_computing(stats))
            sent.append(list(iex.sent_s))
    return {"actions": acts, "sent": sent, "update": upd}


def _update(model, ref: ReferenceModel, step: int, training, alpha: float) -> None:
    """As ``AveragingEngine._update`` with one replica: E1-E3 and the send."""
    before = [t.clone() for t in model.tensors]
    set_lr(model.opt, lr_at(step, training))
    model.opt.step()  # E1
    update = local_update(model.tensors, before)  # E2
    ref.wait_for(step)
    dilute(model.tensors, ref.tensors, alpha)  # E3
    ref.submit(step, update)  # step 3


def _computing(stats: StepStats) -> list[tuple[str, float]]:
    """The step's computing actions as (``F`` or ``B``, seconds)."""
    return [("F", s) for s in stats.fwd_s] + [("B", s) for s in stats.bwd_s]


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _memory(models, ref: Stage) -> dict:
    """F_mod: the N models' weights, gradients, optimizer state and the copy each
    local update takes; F_ref: the reference's weights."""
    total = 0
    for m in models:
        params = list(m.stage.parameters())
        grads = [p.grad for p in params if p.grad is not None]
        state = [v for s in m.opt.state.values() for v in s.values() if torch.is_tensor(v)]
        total += 2 * _bytes(params) + _bytes(grads) + _bytes(state)
    return {"F_mod": total, "F_ref": _bytes(ref.parameters())}


def _inputs(stage: Stage, topo: Topology, chans, data, size: int):
    """A micro-batch of ``size`` samples for this stage: the data's tokens on the
    first stage, else a random activation of the boundary's shape."""
    x, y = data.batch(0, size)
    if not topo.is_first:
        x = torch.randn((size, *chans.in_shape[1:]), dtype=chans.in_dtype, requires_grad=True)
    return x, y


def _pass(stage: Stage, topo: Topology, x, y, pack) -> tuple[float, float]:
    """One forward (saved tensors through ``pack``) and backward of the stage
    alone; their seconds."""
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = stage(x, None)
        loss = stage.loss(out, y, None) if topo.is_last else None
    t1 = time.perf_counter()
    if loss is not None:
        loss.backward()
    else:
        torch.autograd.backward(out, torch.ones_like(out))
    t2 = time.perf_counter()
    stage.zero_grad(set_to_none=True)
    return t1 - t0, t2 - t1


def _peak(stage: Stage, topo: Topology, chans, data, B: int) -> dict:
    """Seconds per sample of a forward and a backward of ``B`` samples (the largest
    micro-batch: the stage's peak rate), the best of ``PEAK_REPEATS``, and the bytes
    autograd saves per sample (parameters aside)."""
    x, y = _inputs(stage, topo, chans, data, B)
    own = {p.data_ptr() for p in stage.parameters()}
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in own:
            saved[0] += t.numel() * t.element_size()
        return t

    fwd, bwd = float("inf"), float("inf")
    for _ in range(PEAK_REPEATS):
        saved[0] = 0
        f, b = _pass(stage, topo, x, y, pack)
        fwd, bwd = min(fwd, f), min(bwd, b)
    return {"v_F": fwd / B, "v_B": bwd / B, "dat_per_sample": saved[0] / B}


class SizeTimer:
    """The stage alone at each size, a forward and backward, the sizes in turn:
    ``run`` before each profiled batch, ``timed`` the medians."""

    def __init__(self, stage: Stage, topo: Topology, chans, data, sizes) -> None:
        self.stage, self.topo = stage, topo
        self.inputs = {z: _inputs(stage, topo, chans, data, z) for z in sorted(set(sizes))}
        self.seconds: dict[int, list[float]] = {z: [] for z in self.inputs}
        self.per_batch = -(-SIZE_REPEATS * len(self.inputs) // BATCHES)  # ceil
        self.turn = 0

    def run(self, warm: bool = False) -> None:
        """One pass at each size untimed (``warm``: first shapes allocate), else the
        next ``per_batch`` sizes in turn, timed."""
        sizes = list(self.inputs)
        if warm:
            for z in sizes:
                _pass(self.stage, self.topo, *self.inputs[z], lambda t: t)
            return
        for _ in range(self.per_batch):
            z = sizes[self.turn % len(sizes)]
            self.turn += 1
            self.seconds[z].append(sum(_pass(self.stage, self.topo, *self.inputs[z], lambda t: t)))

    def timed(self) -> list[list]:
        """[size, median seconds] per size."""
        return [[z, statistics.median(v)] for z, v in self.seconds.items() if v]


def main(tmp: Path) -> None:
    """A profile process (``averaging.tuning`` starts P of them): one thread, as a
    run's rank by default; gloo for the rendezvous; its result as JSON."""
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    job = pickle.loads((tmp / "job.pkl").read_bytes())
    dist.init_process_group("gloo", rank=rank, world_size=job["P"])
    try:
        out = profile_rank(rank, job)
    finally:
        dist.destroy_process_group()
    (tmp / f"rank{rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
