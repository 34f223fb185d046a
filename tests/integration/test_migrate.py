"""Live migration: train on plan A, move blocks over gloo, train on plan B, same numerics.

Real worker processes (torch.multiprocessing, gloo on 127.0.0.1) run the pipeline
runtime's parts (stage, executor, gradient sync, optimizer); midway every rank calls
``migrate`` and continues on the new layout. Losses and final weights must equal the
single-process reference.
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

from jobctl.engine.core.plan import Plan
from jobctl.engine.data.dataset import Sharding, make_data
from jobctl.engine.model.blocks import Stage, model_def
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.rebalance.replan import replan
from jobctl.engine.runtime.executor import Channels, StepExecutor
from jobctl.engine.runtime.migration import migrate, transfers
from jobctl.engine.runtime.optim import build_optimizer, sync_gradients, tied_names
from jobctl.engine.runtime.p2p.gloo import recv_meta, send_meta
from jobctl.engine.runtime.step import train_step
from jobctl.engine.runtime.topology import build_topology
from jobctl.engine.worker.reference import reference_train

from ..jobrun import tiny_spec

SGD = {"training.optimizer": "sgd", "training.lr": 0.3, "training.momentum": 0.9}
BEFORE, AFTER = 2, 2


def _spec(P: int, D: int, **extra):
    return tiny_spec(
        **{
            "training.steps": BEFORE + AFTER,
            "parallelism.pipeline_stages": P,
            "parallelism.data_parallel": D,
            **SGD,
            **extra,
        }
    )


class _Worker:
    """The runtime's parts of one rank, enough to train steps on any plan."""

    def __init__(self, spec, plan: Plan, rank: int):
        self.spec, self.plan, self.rank = spec, plan, rank
        self.mdef = model_def(spec.model, spec.training.seed)
        self.ties = tied_names(self.mdef.ties)
        self.data = make_data(spec)
        self.topo = build_topology(plan, rank, bool(self.mdef.ties))
        self.stage = Stage(self.mdef, plan.stage_of(rank).blocks)
        self.named = dict(self.stage.named_parameters())
        self.opt = build_optimizer(list(self.named.values()), spec.training)
        self.actions = plan.stage_of(rank).action_list()
        self._executor()

    def _executor(self) -> None:
        t, plan = self.topo, self.plan
        shard = Sharding(plan.global_batch_size, plan.D, plan.micro_batch_size)
        if t.is_first:
            x = torch.zeros(shard.micro_batch, self.spec.model.seq_len, dtype=torch.long)
            ins = (None, None)
        else:
            ins = recv_meta(t.prev)
            x = torch.zeros(ins[0], dtype=ins[1])
        with torch.no_grad():
            out = self.stage(x)
        if t.next is not None:
            send_meta(out, t.next)
        chans = Channels(ins[0], ins[1], tuple(out.shape), out.dtype)
        self.ex = StepExecutor(self.stage, t, self.data, shard, chans, torch.device("cpu"))

    def step(self, step: int) -> float | None:
        stats, _ = train_step(
            self.ex,
            self.actions,
            self.opt,
            self.spec.training,
            step,
            self.rank,
            sync=lambda: sync_gradients(self.named, self.topo, self.ties),
        )
        if not self.topo.is_last:
            return None
        total = torch.tensor([float(stats.loss_sum)], dtype=torch.float64)
        if self.topo.dp_group is not None:
            dist.all_reduce(total, group=self.topo.dp_group)
        return float(total)

    def move_to(self, new: Plan) -> bool:
        """Migrate; False if this rank was freed."""
        masks = {n: (p.detach() != 0) for n, p in self.stage.named_parameters()}
        got = migrate(
            self.plan, new, self.rank, self.stage, self.opt, self.mdef, self.spec.training, masks
        )
        self.plan, self.live = new, got.live_group
        if got.freed:
            return False
        self.stage, self.named, self.opt, self.topo = got.stage, got.named, got.opt, got.topo
        self.actions = got.actions
        self.arrived_masks = got.extras
        self._executor()
        return True


def _run(rank: int, world: int, port: int, spec, plan_a: str, plan_b: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    a, b = Plan.model_validate_json(plan_a), Plan.model_validate_json(plan_b)
    w = _Worker(spec, a, rank)
    losses = [w.step(s) for s in range(BEFORE)]
    alive = w.move_to(b)
    if alive:
        losses += [w.step(s) for s in range(BEFORE, BEFORE + AFTER)]
        for name, m in w.arrived_masks.items():  # extras travel with their parameter
            assert m.shape == w.stage.get_parameter(name).shape, name
        rec = {
            "rank": rank,
            "replica": w.topo.replica,
            "blocks": w.stage.block_ids,
            "losses": losses if w.topo.replica == 0 else [],
            "masks": sorted(w.arrived_masks),
        }
        weights = {n: p.detach() for n, p in w.stage.named_parameters(remove_duplicate=False)}
        torch.save(weights, Path(out) / f"weights-{rank}.pt")
        (Path(out) / f"rank-{rank}.json").write_text(json.dumps(rec))
        dist.barrier(group=w.live)
    else:
        rec = {"rank": rank, "losses": losses}
        (Path(out) / f"freed-{rank}.json").write_text(json.dumps(rec))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _migrate_and_compare(tmp_path: Path, spec, new_stages: list[list[int]]):
    plan_a = make_plan(spec)
    plan_b = replan(spec, plan_a, new_stages)
    assert transfers(plan_a, plan_b), "the test must move blocks"
    world = plan_a.world_size
    mp.start_processes(
        _run,
        args=(
            world,
            _free_port(),
            spec,
            plan_a.model_dump_json(),
            plan_b.model_dump_json(),
            str(tmp_path),
        ),
        nprocs=world,
        join=True,
        start_method="spawn",
    )
    ref_losses, ref_weights = reference_train(spec)
    recs = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank-*.json"))]
    freed = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("freed-*.json"))]
    # Step k's loss comes from whichever rank was the last stage of replica 0 then.
    by_step = [[x for x in r["losses"] if x is not None] for r in recs + freed]
    losses = [
        next(r["losses"][k] for r in recs + freed if k < len(r["losses"]) and r["losses"][k])
        for k in range(len(ref_losses))
    ]
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    assert sum(len(x) for x in by_step) == len(ref_losses)  # one reporter per step
    assert sorted(r["rank"] for r in recs) == list(range(plan_b.world_size))
    for r in recs:
        assert r["blocks"] == plan_b.stage_of(r["rank"]).blocks
        weights = torch.load(tmp_path / f"weights-{r['rank']}.pt", weights_only=True)
        for name, value in weights.items():
            canonical = {t.alias: t.canonical for t in model_def(spec.model, 0).ties}.get(
                name, name
            )
            torch.testing.assert_close(value, ref_weights[canonical], atol=1e-5, rtol=0, msg=name)
    return plan_a, plan_b, recs


@pytest.mark.multiproc
def test_migrate_moves_boundaries_and_keeps_numerics(tmp_path):
    # 2 stages x 1: the head (tied alias of the embedding) and two blocks move.
    spec = _spec(2, 1)
    a, b, recs = _migrate_and_compare(tmp_path, spec, [[0, 1, 2, 3, 4], [5]])
    assert a.stages[0].blocks != b.stages[0].blocks
    moved = {r["rank"]: r["masks"] for r in recs}
    assert any(n.startswith("layers.3.") for n in moved[0])  # masks travelled too


@pytest.mark.multiproc
def test_migrate_with_replicas(tmp_path):
    # 2 stages x 2 replicas: each replica's copy comes from the matching replica.
    spec = _spec(2, 2)
    _migrate_and_compare(tmp_path, spec, [[0], [1, 2, 3, 4, 5]])


@pytest.mark.multiproc
def test_pack_frees_a_rank(tmp_path):
    # 3 stages -> 2: rank 2 is freed and exits cleanly; the rest keep training on new
    # process groups with identical numerics.
    spec = _spec(3, 1, **{"hardware.nodes": 2, "hardware.processes_per_node": 2})
    a, b, _ = _migrate_and_compare(tmp_path, spec, [[0, 1, 2], [3, 4, 5]])
    assert (a.P, b.P) == (3, 2)
    assert json.loads((tmp_path / "freed-2.json").read_text())["rank"] == 2


@pytest.mark.multiproc
def test_pack_to_one_stage_colocates_the_tie(tmp_path):
    # 2 stages -> 1: the head arrives next to the embedding and shares its Parameter.
    spec = _spec(2, 1)
    _, b, recs = _migrate_and_compare(tmp_path, spec, [[0, 1, 2, 3, 4, 5]])
    assert b.P == 1 and [r["rank"] for r in recs] == [0]
    w = torch.load(tmp_path / "weights-0.pt", weights_only=True)
    assert torch.equal(w["layers.0.wte.weight"], w["layers.5.weight"])
