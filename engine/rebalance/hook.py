"""The trainer's side of rebalancing and packing (DynPipe Alg. 1 lines 17-23).

After the profiled step that follows a pruning step, every live rank contributes its
per-block forward+backward seconds, nonzero parameter counts and its stage's measured
compute; rank 0 runs the spec's balancer (``rebalance``), optionally the packer
(``choose_pack``; pruning's later collectives then run on the live ranks), builds the
new Plan and broadcasts it. Every rank then migrates its
blocks live (``migrate``), the trainer continues on the new stage, optimizer,
topology and action list, rank 0 rewrites ``plan.json`` (what a resume reads;
checkpoints are per block, so they are layout-independent) and emits ``rebalanced``
or ``packed``. The step after a move is measured and reported as
``rebalance_measured`` (stage compute and step time, before vs after); a move's record
carries its cost (``decide_s`` + ``migrate_s`` + ``resume_s`` = ``seconds``). Freed ranks
(after a pack) close their checkpoint writer and leave the training loop cleanly.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch.distributed as dist

from jobctl.engine.calibration.cache import calibration_for
from jobctl.engine.checkpoint.manager import CheckpointManager
from jobctl.engine.core.env import NODE, SHARED_CKPT_DISK
from jobctl.engine.core.events import Kind
from jobctl.engine.core.plan import Plan
from jobctl.engine.rebalance.rebalancer import imbalance, loads_of, rebalance
from jobctl.engine.rebalance.replan import (
    choose_pack,
    layout_of,
    memory_cap,
    memory_model,
    replan,
    simulate_stages,
)
from jobctl.engine.runtime.executor import StepExecutor, StepStats
from jobctl.engine.runtime.migration import migrate


def _block_nnz(stage) -> dict[int, int]:
    """Nonzero parameter elements per block (tied halves count where they compute)."""
    out: dict[int, int] = {}
    for name, p in stage.named_parameters(remove_duplicate=False):
        b = int(name.split(".")[1])
        out[b] = out.get(b, 0) + int(p.count_nonzero())
    return out


def _compute_s(stats: StepStats) -> float:
    return sum(stats.fwd_s) + sum(stats.bwd_s)


class Rebalancer:
    """Decides and carries out moves for one trainer (one per rank)."""

    def __init__(self, trainer):
        self.t = trainer
        self.cfg = trainer.spec.rebalancing
        self.handled: int | None = None  # profile step already acted on
        self.measure: dict | None = None  # pending "after" measurement
        self.freed = False
        self.pending: tuple[str, dict, int] | None = None  # held move: plan, record, step

    def _group(self):
        return self.t.live_group

    def _gather(self, obj) -> list:
        n = dist.get_world_size(self._group()) if dist.is_initialized() else 1
        out = [None] * n
        dist.all_gather_object(out, obj, group=self._group())
        return out

    def _leader(self) -> bool:
        return self.t.rank == 0

    def after_step(self, done: int, stats: StepStats, seconds: float) -> StepExecutor | None:
        """Called by every live rank after step ``done``; a new executor if layers moved."""
        if self.measure is not None:
            self._report_after(done, stats, seconds)
        p = self.t.pruner
        prof = p.last_profile if p is not None else None
        fresh = prof is not None and prof["step"] == done and self.handled != done
        if self.pending is not None and not fresh and done >= self.pending[2]:
            new_json, record, _ = self.pending
            self.pending = None
            self._measure_before(record, stats, seconds)  # the held layout's last step
            return self._move(Plan.model_validate_json(new_json), record)
        if not self.cfg.enabled or not fresh:
            return None
        self.handled, self.pending = done, None  # a new profile replaces a held move
        return self._rebalance(done, prof, stats, seconds)

    def _measure_before(self, record: dict, stats: StepStats, seconds: float) -> None:
        every = self._gather({"stage": self.t.topo.stage, "c": _compute_s(stats), "s": seconds})
        measured = [0.0] * self.t.plan.P
        for r in every:
            measured[r["stage"]] = max(measured[r["stage"]], r["c"])
        record.update(measured_stage_s_before=measured, measured_step_s_before=max(
            r["s"] for r in every
        ))  # fmt: skip

    # -- deciding -----------------------------------------------------------------
    def _rebalance(self, done: int, prof: dict, stats: StepStats, seconds: float):
        t, t0 = self.t, time.perf_counter()
        mine = {
            "rank": t.rank,
            "replica": t.topo.replica,
            "stage": t.topo.stage,
            "time": {int(b): v["fwd_s"] + v["bwd_s"] for b, v in prof["blocks"].items()},
            "nnz": _block_nnz(t.stage),
            "compute_s": _compute_s(stats),
            "step_s": seconds,
        }
        every = self._gather(mine)
        box = [None, None]
        if self._leader():
            box = list(self._decide(done, every))
        dist.broadcast_object_list(box, src=0, group=self._group())
        new_json, record = box
        record["decide_s"] = time.perf_counter() - t0  # gather, balancer, packer, broadcast
        if new_json is None:
            if self._leader():
                t.events.write(Kind.REBALANCE, **record)
            return None
        if self.cfg.hold_steps:
            record["held_until"] = done + self.cfg.hold_steps
            self.pending = (new_json, record, done + self.cfg.hold_steps)
            return None
        return self._move(Plan.model_validate_json(new_json), record)

    def _decide(self, done: int, every: list[dict]) -> tuple[str | None, dict]:
        t, cfg = self.t, self.cfg
        plan, spec = t.plan, t.spec
        n = len(plan.block_names)
        times, nnz = [0.0] * n, [0] * n
        for r in every:
            if r["replica"] == 0:
                for b, v in r["time"].items():
                    times[b] = v
                for b, v in r["nnz"].items():
                    nnz[b] = v
        costs = times if cfg.by == "time" else [float(x) for x in nnz]
        stages = [list(s.blocks) for s in plan.stages]
        cal = calibration_for(spec)
        lay = layout_of(plan)
        d = rebalance(
            costs, stages, cfg.balancer, cfg.by, cfg.tolerance,
            memory_model(spec, cal, lay), memory_cap(spec),
        )  # fmt: skip
        new_stages, pack = d.stages, None
        if cfg.pack:
            pack = choose_pack(
                spec, cal, plan, times, new_stages, cfg.tolerance, cfg.target_devices,
                cfg.balancer, costs,
            )  # fmt: skip
            if pack is not None:
                new_stages = pack.stages
        before = simulate_stages(spec, cal, lay, stages, times)
        after_lay = layout_of(plan, len(new_stages))
        after = simulate_stages(spec, cal, after_lay, new_stages, times)
        measured = [0.0] * plan.P
        for r in every:
            measured[r["stage"]] = max(measured[r["stage"]], r["compute_s"])
        record = {
            "step": done,
            "balancer": cfg.balancer,
            "by": cfg.by,
            "reason": d.reason,
            "stages_before": stages,
            "stages_after": new_stages,
            "moves": _moves(stages, new_stages),
            "load_before": d.before,
            "load_after": loads_of(costs, new_stages),
            "imbalance_before": d.imbalance_before,
            "imbalance_after": imbalance(loads_of(costs, new_stages)),
            "predicted_stage_s_before": loads_of(times, stages),
            "predicted_stage_s_after": loads_of(times, new_stages),
            "predicted_step_s_before": before.step_time,
            "predicted_step_s_after": after.step_time,
            "measured_stage_s_before": measured,
            "measured_step_s_before": max(r["step_s"] for r in every),
            "packed_to": len(new_stages) if pack is not None else None,
            "pack_considered": pack.considered if pack is not None else None,
        }
        if new_stages == stages:
            return None, record
        return replan(spec, plan, new_stages, after, cal).model_dump_json(), record

    # -- moving -------------------------------------------------------------------
    def _move(self, new: Plan, record: dict) -> StepExecutor | None:
        t = self.t
        old = t.plan
        mine_new = set(new.stage_of(t.rank).blocks) if t.rank < new.world_size else set()
        left = sorted(set(t.stage.block_ids) - mine_new)
        extras = t.pruner.release(left) if t.pruner is not None else {}
        got = migrate(old, new, t.rank, t.stage, t.opt, t.mdef, t.spec.training, extras, t.device)
        packed = new.world_size < old.world_size
        if packed:
            t.ckpt.close()  # parts of earlier steps are all written before the world shrinks
        if got.live_group is not None:
            t.live_group = got.live_group
        t.plan = new
        record.update(
            migrate_s=got.seconds,
            bytes_moved=got.bytes_sent,
            moved_at=record.get("held_until", record["step"]),
        )
        if got.freed:
            self.freed = True
            # host_node: the node script this process runs under (what the backend
            # releases), which torchrun's rendezvous order may map differently from the plan
            host = int(os.environ.get(NODE, old.rank(t.rank).node))
            t.events.write(
                Kind.FREED, rank=t.rank, step=record["step"], migrate_s=got.seconds, host_node=host
            )
            return None
        t.stage, t.named, t.opt, t.topo, t.actions = (
            got.stage,
            got.named,
            got.opt,
            got.topo,
            got.actions,
        )
        self._rebind_pruner(got)
        if packed:
            root = Path(t.spec.checkpoint.local_dir or t.run_dir / "checkpoints")
            shared = os.environ.get(SHARED_CKPT_DISK, "1") == "1"
            t.ckpt = CheckpointManager(t.spec, new, t.rank, root, t.events, shared)
        t1 = time.perf_counter()
        ex = t.make_executor()  # the pipeline probes its new activation shapes
        # Every live rank can train again: the next step would wait for the slowest rank
        # anyway, so the leader's clock now holds the move's whole cost.
        dist.barrier(group=t.live_group)
        record["resume_s"] = time.perf_counter() - t1
        # the rebalancing's whole cost (DynPipe Table 4.1: decision and transfer)
        record["seconds"] = record["decide_s"] + record["migrate_s"] + record["resume_s"]
        if self._leader():
            tmp = t.run_dir / "plan.json.tmp"
            tmp.write_text(new.model_dump_json(indent=2))
            tmp.replace(t.run_dir / "plan.json")
            if packed:
                freed_ranks = list(range(new.world_size, old.world_size))
                live_nodes = {r.node for r in new.ranks}
                freed_nodes = sorted({r.node for r in old.ranks} - live_nodes)
                record.update(freed_ranks=freed_ranks, freed_nodes=freed_nodes)
            t.events.write(Kind.PACKED if packed else Kind.REBALANCED, **record)
        self.measure = record
        return ex

    def _rebind_pruner(self, got) -> None:
        p = self.t.pruner
        if p is None:
            return
        p.stage, p.topo = got.stage, got.topo
        p.rebind(got.named, got.opt, self.t.live_group)
        for name in [n for n in p.masks if n not in got.named]:
            _drop_mask(p, name)
        for name, mask in got.extras.items():
            if name in got.named:
                p.adopt(name, mask)

    def _report_after(self, done: int, stats: StepStats, seconds: float) -> None:
        before, self.measure = self.measure, None
        every = self._gather({"stage": self.t.topo.stage, "c": _compute_s(stats), "s": seconds})
        if not self._leader():
            return
        measured = [0.0] * self.t.plan.P
        for r in every:
            measured[r["stage"]] = max(measured[r["stage"]], r["c"])
        after_step = max(r["s"] for r in every)
        self.t.events.write(
            Kind.REBALANCE_MEASURED,
            step=done,
            measured_stage_s_before=before["measured_stage_s_before"],
            measured_stage_s_after=measured,
            imbalance_measured_before=imbalance(before["measured_stage_s_before"]),
            imbalance_measured_after=imbalance(measured),
            step_s_before=before["measured_step_s_before"],
            step_s_after=after_step,
        )


def _moves(old: list[list[int]], new: list[list[int]]) -> list[list[int]]:
    """[block, old stage, new stage] for every block whose stage index changes."""
    where = {b: k for k, blocks in enumerate(new) for b in blocks}
    return [[b, k, where[b]] for k, blocks in enumerate(old) for b in blocks if where[b] != k]


def _drop_mask(pruner, name: str) -> None:
    """A tied alias now shares its canonical's Parameter: the canonical's mask rules."""
    pruner.masks.pop(name, None)
    getattr(pruner, "_pruned", {}).pop(name, None)
