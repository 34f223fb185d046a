"""The trainer's side of rebalancing and packing (DynPipe Alg. 1 lines 17-23).

After the profiled step that follows a pruning step, every live rank contributes its
per-block forward+backward seconds, nonzero parameter counts and its stage's measured
compute; rank 0 runs the spec's balancer (``rebalance``), optionally the packer
(``choose_pack``; pruning's later collectives then run on the live ranks), builds the
new Plan and broadcasts it. Every rank then migrates its
blocks live (``migrate``) and hands the trainer a ``Relayout`` (the new stage,
optimizer, topology and action list), which the trainer applies; once it trains
again, rank 0 rewrites ``plan.json`` (what a resume reads;
checkpoints are per block, so they are layout-independent) and emits ``rebalanced``
or ``packed``. The step after a move is measured and reported as
``rebalance_measured`` (stage compute and step time, before vs after); a move's record
carries its cost (``decide_s`` + ``migrate_s`` + ``resume_s`` = ``seconds``). Freed ranks
(after a pack) leave the training loop cleanly once the trainer closed their
checkpoint writer.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from jobctl.engine.calibration.cache import calibration_for
from jobctl.engine.core.env import NODE
from jobctl.engine.core.events import EventLog, Kind
from jobctl.engine.core.plan import Plan
from jobctl.engine.model.blocks import ModelDef
from jobctl.engine.pruning.pruner import Pruner
from jobctl.engine.rebalance.rebalancer import Decision, imbalance, loads_of, rebalance
from jobctl.engine.rebalance.replan import (
    choose_pack,
    layout_of,
    memory_cap,
    memory_model,
    replan,
    simulate_stages,
)
from jobctl.engine.runtime.executor import StepStats
from jobctl.engine.runtime.hook import Relayout, StageState, StepEnd, StepHook
from jobctl.engine.runtime.migration import Migrated, hosted_blocks, migrate
from jobctl.spec.job import JobSpec


def _block_nnz(stage, tp=None, T: int = 1) -> dict[int, float]:
    """Nonzero parameter elements per block (tied halves count where they compute);
    T > 1: this rank's part, a whole parameter's 1/T, so the T group sums to the
    block's count."""
    out: dict[int, float] = {}
    for name, p in stage.named_parameters(remove_duplicate=False):
        b = int(name.split(".")[1])
        share = 1.0 if tp is None or tp.split_of(name) is not None else 1.0 / T
        out[b] = out.get(b, 0) + share * int(p.count_nonzero())
    return out


def _compute_s(stats: StepStats) -> float:
    return sum(stats.fwd_s) + sum(stats.bwd_s)


def _stage_maxima(every: list[dict], P: int, key: str) -> list[float]:
    """Per stage, the largest ``key`` over its replicas' records."""
    measured = [0.0] * P
    for r in every:
        measured[r["stage"]] = max(measured[r["stage"]], r[key])
    return measured


class Rebalancer(StepHook):
    """Decides and carries out moves for one rank's trainer (a step hook)."""

    def __init__(
        self,
        spec: JobSpec,
        mdef: ModelDef,
        device: torch.device,
        events: EventLog,
        run_dir: Path,
        pruner: Pruner | None = None,
        copies=None,
    ):
        self.spec, self.cfg, self.mdef, self.device = spec, spec.rebalancing, mdef, device
        self.events, self.run_dir, self.pruner = events, run_dir, pruner
        # other copies of the stage that move with it (AvgPipe's: averaging.parts.Moves)
        self.copies = copies
        self.done = 0  # optimizer steps done, as of the latest step
        self.state: StageState | None = None  # the trainer's, as of the latest step
        self.handled: int | None = None  # profile step already acted on
        self.measure: dict | None = None  # pending "after" measurement
        self.pending: tuple[str, dict, int] | None = None  # held move: plan, record, step

    @property
    def rank(self) -> int:
        return self.state.topo.rank

    def _group(self):
        return self.state.live_group

    def _gather(self, obj) -> list:
        n = dist.get_world_size(self._group()) if dist.is_initialized() else 1
        out = [None] * n
        dist.all_gather_object(out, obj, group=self._group())
        return out

    def _leader(self) -> bool:
        return self.rank == 0

    def _where(self) -> int:
        """This rank's place in the per-stage figures: its stage, or a V rank's device."""
        return self.state.plan.rank(self.rank).stage

    def after_step(self, end: StepEnd) -> Relayout | None:
        """Called by every live rank after step ``end.done``; a new stage if layers moved."""
        self.state = end.state
        done = self.done = end.done
        if self.measure is not None:
            self._report_after(done, end.stats, end.seconds)
        p = self.pruner
        prof = p.last_profile if p is not None else None
        fresh = prof is not None and prof["step"] == done and self.handled != done
        if self.pending is not None and not fresh and done >= self.pending[2]:
            new_json, record, _ = self.pending
            self.pending = None
            self._measure_before(record, end.stats, end.seconds)  # the held layout's last step
            return self._move(Plan.model_validate_json(new_json), record)
        if not self.cfg.enabled or not fresh:
            return None
        self.handled, self.pending = done, None  # a new profile replaces a held move
        return self._rebalance(done, prof, end.stats, end.seconds)

    def _measure_before(self, record: dict, stats: StepStats, seconds: float) -> None:
        every = self._gather({"stage": self._where(), "c": _compute_s(stats), "s": seconds})
        record.update(
            measured_stage_s_before=_stage_maxima(every, self.state.plan.P, "c"),
            measured_step_s_before=max(r["s"] for r in every),
        )

    # -- deciding -----------------------------------------------------------------
    def _rebalance(self, done: int, prof: dict, stats: StepStats, seconds: float):
        t0, topo = time.perf_counter(), self.state.topo
        mine = {
            "rank": self.rank,
            "replica": topo.replica,
            "stage": self._where(),
            "time": {int(b): v["fwd_s"] + v["bwd_s"] for b, v in prof["blocks"].items()},
            "nnz": _block_nnz(self.state.stage, self.state.tp, self.state.plan.T),
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
                self.events.write(Kind.REBALANCE, **record)
            return None
        if self.cfg.hold_steps:
            record["held_until"] = done + self.cfg.hold_steps
            self.pending = (new_json, record, done + self.cfg.hold_steps)
            return None
        return self._move(Plan.model_validate_json(new_json), record)

    def _decide(self, done: int, every: list[dict]) -> tuple[str | None, dict]:
        """The leader's decision: the new plan (None: layers stay) and its record."""
        cfg, plan, spec = self.cfg, self.state.plan, self.spec
        times, nnz = replica0_blocks(every, len(plan.block_names))
        costs = times if cfg.by == "time" else [float(x) for x in nnz]
        stages = [list(s.blocks) for s in plan.stages]
        cal = calibration_for(spec)
        lay = layout_of(plan)
        mem = (memory_model(spec, cal, lay), memory_cap(spec.hardware))
        d = rebalance(costs, stages, cfg.balancer, cfg.by, cfg.tolerance, *mem)
        new_stages, pack = d.stages, None
        if cfg.pack:
            knobs = (cfg.tolerance, cfg.target_devices, cfg.balancer)
            pack = choose_pack(spec, cal, plan, times, new_stages, *knobs, costs)
            if pack is not None:
                new_stages = pack.stages
        before = simulate_stages(spec, cal, lay, stages, times)
        after_lay = lay if pack is None else layout_of(plan, len(new_stages))
        after = simulate_stages(spec, cal, after_lay, new_stages, times)
        record = {
            **decision_fields(done, d, costs, times, stages, new_stages),
            "predicted_step_s_before": before.step_time,
            "predicted_step_s_after": after.step_time,
            "measured_stage_s_before": _stage_maxima(every, plan.P, "compute_s"),
            "measured_step_s_before": max(r["step_s"] for r in every),
            "packed_to": len(new_stages) if pack is not None else None,
            "pack_considered": pack.considered if pack is not None else None,
        }
        if new_stages == stages:
            return None, record
        return replan(spec, plan, new_stages, after, cal).model_dump_json(), record

    # -- moving -------------------------------------------------------------------
    def _move(self, new: Plan, record: dict) -> Relayout:
        """Migrate this rank's blocks to ``new``'s layout; the trainer applies the result."""
        st = self.state
        old, rank = st.plan, self.rank
        mine_new = set(hosted_blocks(new, rank)) if rank < new.world_size else set()
        left = sorted(set(st.stage.block_ids) - mine_new)
        extras = self.pruner.release(left) if self.pruner is not None else {}
        training = self.spec.training
        args = (st.stage, st.opt, self.mdef, training, extras, self.device)
        copies = [] if self.copies is None else self.copies.settled(self.done)
        got = migrate(old, new, rank, *args, tp=st.tp, copies=copies)
        if self.copies is not None and not got.freed:
            self.copies.adopt(got.stage, got.named, got.opt, got.copies, self.done)
        live = got.live_group if got.live_group is not None else st.live_group
        record.update(
            migrate_s=got.seconds,
            bytes_moved=got.bytes_sent,
            moved_at=record.get("held_until", record["step"]),
        )
        if got.freed:
            return Relayout(None, lambda _: self._freed(old, record, got.seconds))
        state = StageState(new, got.stage, got.named, got.opt, got.topo, got.actions, live, st.tp)
        self._rebind_pruner(got, live)
        return Relayout(state, lambda resume_s: self._moved(old, new, record, resume_s))

    def _freed(self, old: Plan, record: dict, migrate_s: float) -> None:
        """This rank was packed away: say so, with the node script it runs under."""
        # host_node: the node script this process runs under (what the backend
        # releases), which torchrun's rendezvous order may map differently from the plan
        host = int(os.environ.get(NODE, old.rank(self.rank).node))
        self.events.write(
            Kind.FREED, rank=self.rank, step=record["step"], migrate_s=migrate_s, host_node=host
        )

    def _moved(self, old: Plan, new: Plan, record: dict, resume_s: float) -> None:
        """The trainer trains on under ``new``: record the move's whole cost and, on the
        leader, publish the new plan and the move."""
        record["resume_s"] = resume_s
        # the rebalancing's whole cost (DynPipe Table 4.1: decision and transfer)
        record["seconds"] = record["decide_s"] + record["migrate_s"] + record["resume_s"]
        if self._leader():
            tmp = self.run_dir / "plan.json.tmp"
            tmp.write_text(new.model_dump_json(indent=2))
            tmp.replace(self.run_dir / "plan.json")
            packed = new.world_size < old.world_size
            if packed:
                freed_nodes = sorted({r.node for r in old.ranks} - {r.node for r in new.ranks})
                freed_ranks = list(range(new.world_size, old.world_size))
                record.update(freed_ranks=freed_ranks, freed_nodes=freed_nodes)
            self.events.write(Kind.PACKED if packed else Kind.REBALANCED, **record)
        self.measure = record

    def _rebind_pruner(self, got: Migrated, live_group) -> None:
        p = self.pruner
        if p is None:
            return
        p.stage, p.topo = got.stage, got.topo
        p.rebind(got.named, got.opt, live_group)
        for name in [n for n in p.masks if n not in got.named]:
            _drop_mask(p, name)
        for name, mask in got.extras.items():
            if name in got.named:
                p.adopt(name, mask)

    def _report_after(self, done: int, stats: StepStats, seconds: float) -> None:
        before, self.measure = self.measure, None
        every = self._gather({"stage": self._where(), "c": _compute_s(stats), "s": seconds})
        if not self._leader():
            return
        measured = _stage_maxima(every, self.state.plan.P, "c")
        step_s = max(r["s"] for r in every)
        self.events.write(
            Kind.REBALANCE_MEASURED, **measured_fields(done, before, measured, step_s)
        )


def replica0_blocks(every: list[dict], n: int) -> tuple[list[float], list[int]]:
    """Per block, replica 0's measured seconds (the slowest of a T group's shards)
    and nonzero parameter count (summed over them). A Mobius rank's offer names no
    replica (``rebalance.swapped``): it is the one copy of its blocks, so it counts as
    replica 0; its block keys may be the profile's strings."""
    times, nnz = [0.0] * n, [0.0] * n
    for r in every:
        if r.get("replica", 0) == 0:
            for b, v in r["time"].items():
                times[int(b)] = max(times[int(b)], v)
            for b, v in r["nnz"].items():
                nnz[int(b)] += v
    return times, [round(x) for x in nnz]


def decision_fields(
    done: int,
    d: Decision,
    costs: list[float],
    times: list[float],
    stages: list[list[int]],
    new_stages: list[list[int]],
) -> dict:
    """A decision's record: the balancer's loads and the per-stage predictions."""
    return {
        "step": done,
        "balancer": d.balancer,
        "by": d.by,
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
    }


def measured_fields(done: int, before: dict, measured: list[float], step_s: float) -> dict:
    """The ``rebalance_measured`` record: the stage seconds and step time measured on
    the step after a move (``measured``, ``step_s``) beside those its record ``before``
    holds from the step it was decided on."""
    return {
        "step": done,
        "measured_stage_s_before": before["measured_stage_s_before"],
        "measured_stage_s_after": measured,
        "imbalance_measured_before": imbalance(before["measured_stage_s_before"]),
        "imbalance_measured_after": imbalance(measured),
        "step_s_before": before["measured_step_s_before"],
        "step_s_after": step_s,
    }


def _moves(old: list[list[int]], new: list[list[int]]) -> list[list[int]]:
    """[block, old stage, new stage] for every block whose stage index changes."""
    where = {b: k for k, blocks in enumerate(new) for b in blocks}
    return [[b, k, where[b]] for k, blocks in enumerate(old) for b in blocks if where[b] != k]


def _drop_mask(pruner: Pruner, name: str) -> None:
    """A tied alias now shares its canonical's Parameter: the canonical's mask rules."""
    pruner.masks.pop(name, None)
    getattr(pruner, "_pruned", {}).pop(name, None)
