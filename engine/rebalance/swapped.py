"""DynPipe's rebalancing over Mobius's swapped stages (the loop's hook of a Mobius rank).

Under ``schedule: mobius`` the S stages run in one global order over N ranks, each
uploaded before it runs, so the slowest stage holds up its neighbours on the other
ranks as in any pipeline; pruning changes the blocks' costs (their nonzero counts
and, with sparse kernels, their time). After the profiled step that follows a
pruning step (``pruning.swapped.SwappedProfiler``: every block of every stage), every
rank offers its blocks' measured seconds and nonzero counts; rank 0 runs the spec's
balancer (``rebalancer.rebalance``) over the S stages under the Mobius memory rule
(the MIP's constraint 4 and two stage records per device, ``mobius.planning.plan.
stage_memory``), prices the old and the new cut with the MIP's step model
(``planning.plan.cut_step_s``) and broadcasts the re-cut plan (``planning.plan.recut``).
Every rank then re-cuts its runner (``mobius.relayout``) and hands the loop a
``SwappedLayout``. S and the rank of each stage stay: Mobius's cross
mapping (sec. 3.3) placed the stages, and packing onto fewer devices is refused at
``validate`` (``spec.mobius``). The step after a move is profiled again, so the
``rebalance_measured`` record compares measured stage seconds before and after.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch.distributed as dist

from jobctl.engine.calibration.cache import calibration_for
from jobctl.engine.core.events import EventLog, Kind
from jobctl.engine.core.plan import Plan
from jobctl.engine.mobius.engine import SwappedEngine, SwappedLayout
from jobctl.engine.mobius.planning.plan import cut_step_s, recut, stage_memory
from jobctl.engine.mobius.relayout import relaid
from jobctl.engine.model.blocks import ModelDef
from jobctl.engine.pruning.swapped import SwappedPruner
from jobctl.engine.rebalance.hook import decision_fields, measured_fields, replica0_blocks
from jobctl.engine.rebalance.rebalancer import loads_of, rebalance
from jobctl.engine.runtime.hook import Relayout, StepEnd, StepHook
from jobctl.spec.job import JobSpec


class SwappedRebalancer(StepHook):
    """Decides and carries out a Mobius rank's re-cuts."""

    def __init__(
        self,
        spec: JobSpec,
        mdef: ModelDef,
        engine: SwappedEngine,
        pruner: SwappedPruner,
        events: EventLog,
        run_dir: Path,
    ):
        self.spec, self.cfg, self.mdef = spec, spec.rebalancing, mdef
        self.engine, self.pruner, self.events, self.run_dir = engine, pruner, events, run_dir
        self.handled: int | None = None  # profile step already acted on
        self.measure: dict | None = None  # a move's record, awaiting its "after" profile
        self.pending: tuple[Plan, dict, int] | None = None  # held move: plan, record, step

    @property
    def _leader(self) -> bool:
        return self.engine.runner.cfg.rank == 0

    def _gather(self, obj) -> list:
        group = self.engine.runner.links.group
        out = [None] * (dist.get_world_size(group) if dist.is_initialized() else 1)
        if len(out) == 1:
            return [obj]
        dist.all_gather_object(out, obj, group=group)
        return out

    def after_step(self, end: StepEnd) -> Relayout | None:
        """Called by every rank after step ``end.done``; a re-cut runner if blocks moved."""
        done, prof = end.done, self.pruner.last_profile
        fresh = prof is not None and prof["step"] == done and self.handled != done
        if fresh and self.measure is not None:
            self.handled = done  # the move's own "after" profile: measured, not decided on
            return self._report_after(done, prof, end.seconds)
        if self.pending is not None and not fresh and done >= self.pending[2]:
            new, record, _ = self.pending
            self.pending = None
            return self._move(new, record)
        if not self.cfg.enabled or not fresh:
            return None
        self.handled, self.pending = done, None  # a new profile replaces a held move
        return self._rebalance(done, prof, end.seconds)

    def _offer(self, prof: dict, seconds: float) -> list[dict]:
        times = {b: v["fwd_s"] + v["bwd_s"] for b, v in prof["blocks"].items()}
        return self._gather({"time": times, "nnz": prof["nonzero"], "step_s": seconds})

    def _rebalance(self, done: int, prof: dict, seconds: float) -> Relayout | None:
        t0 = time.perf_counter()
        every = self._offer(prof, seconds)
        box = list(self._decide(done, every)) if self._leader else [None, None]
        dist.broadcast_object_list(box, src=0, group=self.engine.runner.links.group)
        new_json, record = box
        record["decide_s"] = time.perf_counter() - t0  # gather, balancer, broadcast
        if new_json is None:
            if self._leader:
                self.events.write(Kind.REBALANCE, **record)
            return None
        new = Plan.model_validate_json(new_json)
        if self.cfg.hold_steps:
            record["held_until"] = done + self.cfg.hold_steps
            self.pending = (new, record, done + self.cfg.hold_steps)
            return None
        return self._move(new, record)

    def _decide(self, done: int, every: list[dict]) -> tuple[str | None, dict]:
        """The leader's decision: the re-cut plan (None: blocks stay) and its record."""
        cfg, plan, spec = self.cfg, self.engine.plan, self.spec
        times, nnz = replica0_blocks(every, len(plan.block_names))
        costs = times if cfg.by == "time" else nnz
        stages = [list(s) for s in plan.mobius.stages]
        cal = calibration_for(spec)
        memory, cap = stage_memory(spec, cal, plan)
        d = rebalance(costs, stages, cfg.balancer, cfg.by, cfg.tolerance, memory, cap)
        record = {
            **decision_fields(done, d, costs, times, stages, d.stages),
            "predicted_step_s_before": cut_step_s(spec, cal, plan, stages),
            "predicted_step_s_after": cut_step_s(spec, cal, plan, d.stages),
            "measured_stage_s_before": loads_of(times, stages),
            "measured_step_s_before": max(r["step_s"] for r in every),
            "packed_to": None,
        }
        if d.stages == stages:
            return None, record
        return recut(spec, cal, plan, d.stages).model_dump_json(), record  # only a move's plan

    def _move(self, new: Plan, record: dict) -> Relayout:
        """Re-cut this rank's runner to ``new``'s stages; the loop applies the result."""
        t0 = time.perf_counter()
        runner = relaid(self.engine.runner, self.mdef, new.mobius.stages)
        record.update(migrate_s=time.perf_counter() - t0)
        record["moved_at"] = record.get("held_until", record["step"])
        return Relayout(SwappedLayout(new, runner), lambda s: self._moved(new, record, s))

    def _moved(self, new: Plan, record: dict, resume_s: float | None) -> None:
        """Training goes on under ``new``: the move's cost; the leader publishes it."""
        record["resume_s"] = resume_s or 0.0
        record["seconds"] = record["decide_s"] + record["migrate_s"] + record["resume_s"]
        if self._leader:
            tmp = self.run_dir / "plan.json.tmp"
            tmp.write_text(new.model_dump_json(indent=2))
            tmp.replace(self.run_dir / "plan.json")  # what a resume reads
            self.events.write(Kind.REBALANCED, **record)
        self.measure = record
        self.pruner.profile_at = record["moved_at"]  # the next step measures the new cut

    def _report_after(self, done: int, prof: dict, seconds: float) -> None:
        before, self.measure = self.measure, None
        every = self._offer(prof, seconds)
        if not self._leader:
            return None
        times, _ = replica0_blocks(every, len(self.engine.plan.block_names))
        measured = loads_of(times, self.engine.plan.mobius.stages)
        step_s = max(r["step_s"] for r in every)
        self.events.write(
            Kind.REBALANCE_MEASURED, **measured_fields(done, before, measured, step_s)
        )
        return None
