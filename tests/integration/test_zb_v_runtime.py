"""ZB-V in the runtime: two ranks each host two of four stages (V shape), and two
training steps equal one process, with and without recompute.

Real worker processes (torch.multiprocessing, gloo on 127.0.0.1) run the runtime's
parts: a ``StepExecutor`` per stage, ``TwoStageExecutor`` over a rank's ``zb_v`` list
(the hand-over between stages 1 and 2 on rank 1 in memory), ``train_step`` with the
optimizer over both stages; the tied embedding and head share one Parameter on rank 0.
Between the ranks, gloo, or a shared-memory link per stage boundary (``v_links``: the
V's down leg and up leg each have their own between ranks 0 and 1).
"""

from __future__ import annotations

import json
import socket
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from jobctl.engine.data.dataset import Sharding, make_data
from jobctl.engine.model.blocks import Stage, model_def
from jobctl.engine.runtime.executor import Channels, StepExecutor
from jobctl.engine.runtime.optim import build_optimizer
from jobctl.engine.runtime.p2p.shm import connect
from jobctl.engine.runtime.step import train_step
from jobctl.engine.runtime.two_stage import TwoStageExecutor, share_ties, v_links, v_topology
from jobctl.engine.schedule.zero_bubble import zb_v
from jobctl.engine.worker.reference import reference_train

from ..jobrun import tiny_spec

P, STEPS = 2, 2
BLOCKS = [[0, 1], [2], [3], [4, 5]]  # embedding + block, block, block, block + head


def _spec():
    return tiny_spec(
        **{
            "training.steps": STEPS,
            "training.global_batch_size": 8,  # M = 4 micro-batches of 2 (M >= 2P - 1)
            "training.optimizer": "sgd",
            "training.lr": 0.3,
            "training.momentum": 0.9,
            "parallelism.pipeline_stages": 1,
            "parallelism.data_parallel": 1,
            "hardware.nodes": 1,
            "hardware.processes_per_node": 1,
        }
    )


def _executor(spec, rank: int, shm: bool) -> tuple[TwoStageExecutor, list[Stage]]:
    mdef = model_def(spec.model, spec.training.seed)
    t = spec.training
    shard, data = Sharding(t.global_batch_size, 1, t.micro_batch_size), make_data(spec)
    topos = v_topology(P, rank, lambda d: d)
    stages = [Stage(mdef, BLOCKS[topo.stage]) for topo in topos]
    share_ties(stages, mdef.ties)
    act = (t.micro_batch_size, spec.model.seq_len, spec.model.hidden)  # every boundary
    cpu, M = torch.device("cpu"), shard.micro_batches
    chans = [
        Channels(act if topo.stage else None, torch.float32, act, torch.float32) for topo in topos
    ]
    links = [{}, {}]
    if shm:
        links = v_links(topos, chans, lambda peer, sh, dt: connect(peer, sh, dt, cpu, True, 60, M))
        rings = [link for ln in links for link in ln.values()]
        assert len(rings) == 2 and all(rings) and rings[0] is not rings[1]  # one per boundary
    executors = [
        StepExecutor(stage, topo, data, shard, c, cpu, links=ln)
        for stage, topo, c, ln in zip(stages, topos, chans, links, strict=True)
    ]
    return TwoStageExecutor(executors), stages


def _run(rank: int, port: int, spec, recompute: bool, shm: bool, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=P,
        timeout=timedelta(seconds=60),
    )
    ex, stages = _executor(spec, rank, shm)
    params = list({id(p): p for st in stages for p in st.parameters()}.values())
    opt = build_optimizer(params, spec.training)
    M = spec.training.global_batch_size // spec.training.micro_batch_size
    placed = zb_v(P, M, recompute=recompute)[rank]
    losses = []
    for step in range(STEPS):
        stats, _ = train_step(ex, placed, opt, spec.training, step, rank)  # type: ignore[arg-type]
        losses.append(float(stats.loss_sum))
    weights = {
        n: p.detach() for st in stages for n, p in st.named_parameters(remove_duplicate=False)
    }
    torch.save(weights, Path(out) / f"weights-{rank}.pt")
    (Path(out) / f"losses-{rank}.json").write_text(json.dumps(losses))
    ex.close()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multiproc
@pytest.mark.parametrize(
    ("recompute", "shm"),
    [(False, False), (False, True), (True, True)],
    ids=["gloo", "shm", "shm-R"],
)
def test_zb_v_two_stages_per_rank_equal_one_process(
    tmp_path: Path, recompute: bool, shm: bool
) -> None:
    spec = _spec()
    mp.start_processes(
        _run,
        args=(_free_port(), spec, recompute, shm, str(tmp_path)),
        nprocs=P,
        join=True,
        start_method="spawn",
    )
    ref_losses, ref_weights = reference_train(spec)
    # Rank 0 hosts the last stage (2P-1): its losses are the step's.
    losses = json.loads((tmp_path / "losses-0.json").read_text())
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    ties = {t.alias: t.canonical for t in model_def(spec.model, 0).ties}
    seen = set()
    for rank in range(P):
        weights = torch.load(tmp_path / f"weights-{rank}.pt", weights_only=True)
        for name, value in weights.items():
            torch.testing.assert_close(
                value, ref_weights[ties.get(name, name)], atol=1e-5, rtol=0, msg=name
            )
            seen.add(ties.get(name, name))
    assert seen == set(ref_weights)  # every parameter came from one of the ranks
