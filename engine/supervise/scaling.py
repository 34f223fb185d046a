"""Growing and shrinking a running job: scale requests, returning capacity, stragglers.

A morph is a graceful stop (every rank checkpoints the same step, as on `jobctl stop`)
followed by a relaunch re-planned for a new device count with the same global batch.
The supervisor learns that it should morph from a *scale request*: a small JSON file
``scale.json`` in the run folder, written by ``jobctl scale RUN N`` (now) or by the
supervisor itself after a preemption shrank the job (capacity returns: after
``elasticity.regrow_backoff_s`` the lost slots count as free again and the job grows
back to the pool at its next checkpoint). The monitor reads it each round, so a
request reaches a supervisor running detached just as well.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from jobctl.engine.core.plan import Plan
from jobctl.engine.planner.resolver import PlanError, make_plan
from jobctl.engine.state.db import StateDB
from jobctl.spec import ElasticitySpec, JobSpec

if TYPE_CHECKING:  # the monitor imports this module
    from jobctl.engine.supervise.monitor import Outcome

REQUEST = "scale.json"


@dataclass(frozen=True)
class ScaleRequest:
    """Morph to ``devices`` once the wall clock passes ``not_before`` (and, with
    ``at_checkpoint``, a checkpoint was written since then)."""

    devices: int
    reason: str
    not_before: float = 0.0
    at_checkpoint: bool = False


def write_request(run_dir: Path, req: ScaleRequest) -> None:
    """Leave ``req`` for the run's supervisor (atomically: never half a request)."""
    tmp = run_dir / f".{REQUEST}.{os.getpid()}"
    tmp.write_text(json.dumps(asdict(req)))
    tmp.replace(run_dir / REQUEST)


def read_request(run_dir: Path) -> ScaleRequest | None:
    path = run_dir / REQUEST
    try:
        return ScaleRequest(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None


def clear_request(run_dir: Path) -> None:
    (run_dir / REQUEST).unlink(missing_ok=True)


class ScaleWatch:
    """The monitor's view of the run's scale request: due or not yet."""

    def __init__(self, run_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.run_dir, self.clock = run_dir, clock
        self.last_checkpoint_ts = 0.0

    def checkpointed(self, ts: float) -> None:
        self.last_checkpoint_ts = max(self.last_checkpoint_ts, ts)

    def due(self) -> ScaleRequest | None:
        """The request, removed from the run folder, once it is due; else None."""
        req = read_request(self.run_dir)
        if req is None or self.clock() < req.not_before:
            return None
        if req.at_checkpoint and self.last_checkpoint_ts < req.not_before:
            return None
        clear_request(self.run_dir)
        return req


def pool_devices(spec: JobSpec) -> int:
    """Devices of the hardware pool, capped by ``elasticity.max_devices``."""
    hw = spec.hardware
    pool = hw.nodes * hw.processes_per_node
    return min(pool, spec.elasticity.max_devices or pool)


def check_devices(spec: JobSpec, devices: int) -> str | None:
    """Why the job cannot run on ``devices`` (naming the field to change), or None."""
    el, hw = spec.elasticity, spec.hardware
    pool = hw.nodes * hw.processes_per_node
    if devices < el.min_devices:
        return (
            f"{devices} device(s) is below elasticity.min_devices ({el.min_devices}): "
            "ask for more, or lower elasticity.min_devices in the job spec"
        )
    if el.max_devices is not None and devices > el.max_devices:
        return (
            f"{devices} device(s) is above elasticity.max_devices ({el.max_devices}): "
            "ask for fewer, or raise elasticity.max_devices in the job spec"
        )
    if devices > pool:
        return (
            f"{devices} device(s) is more than the hardware pool has ({pool} = hardware.nodes "
            f"{hw.nodes} x hardware.processes_per_node {hw.processes_per_node}): ask for "
            "fewer, or grow the pool in the job spec"
        )
    if morph_plan(spec, devices) is None:
        return f"no layout of the model fits {devices} device(s) with the same global batch"
    return None


def morph_plan(spec: JobSpec, devices: int) -> Plan | None:
    """The plan for ``devices``; explicit P and D become free when they no longer fit."""
    if devices < max(1, spec.elasticity.min_devices):
        return None
    try:
        return make_plan(spec, devices)
    except PlanError:
        par = spec.parallelism.model_copy(
            update={"pipeline_stages": "auto", "data_parallel": "auto"}
        )
        try:
            return make_plan(spec.model_copy(update={"parallelism": par}), devices)
        except PlanError:
            return None


def excluded_devices(
    el: ElasticitySpec, plan: Plan, straggler_nodes: list[int], lost: list[int]
) -> int:
    """Devices of straggler nodes to leave out at this morph (``exclude_stragglers``)."""
    if not el.exclude_stragglers:
        return 0
    sizes = plan.node_sizes()
    return sum(sizes[n] for n in set(straggler_nodes) - set(lost) if n < len(sizes))


def _target_devices(el: ElasticitySpec, plan: Plan, outcome: Outcome) -> int | None:
    """Devices the next attempt asks for after ``outcome`` (stragglers still in), or None
    when the run is over: a morph's own target, or after a preemption (with
    ``elasticity.enabled``) the devices left."""
    if outcome.kind == "morph":
        return outcome.devices
    if outcome.kind == "preempted" and el.enabled:
        sizes = plan.node_sizes()
        return plan.world_size - sum(sizes[n] for n in outcome.lost_nodes if n < len(sizes))
    return None


def next_attempt(
    spec: JobSpec, plan: Plan, outcome: Outcome, db: StateDB, run_id: str, backend: str
) -> Plan | None:
    """The plan of the next attempt after ``outcome``, or None when the run is over.

    Straggler nodes are left out when ``elasticity.exclude_stragglers`` says so. After
    a preemption on the local backend the lost slots come back after
    ``elasticity.regrow_backoff_s``, and the run grows back at its next checkpoint.
    """
    clear_request(db.runs_dir / run_id)  # a request not yet due dies with its attempt
    target = _target_devices(spec.elasticity, plan, outcome)
    if target is None:
        return None
    lost = outcome.lost_nodes
    skip = excluded_devices(spec.elasticity, plan, outcome.straggler_nodes, lost)
    if skip and morph_plan(spec, target - skip) is None:
        skip = 0  # leaving the stragglers out would leave too little: keep them
    devices = target - skip
    next_plan = morph_plan(spec, devices)
    if next_plan is None:
        outcome.message += f"; {devices} device(s) left, below elasticity.min_devices"
        return None
    left_out = sorted(set(outcome.straggler_nodes) - set(lost)) if skip else []
    note = f"; straggler node(s) {left_out} left out ({skip} device(s))" if skip else ""
    now = time.time()
    if outcome.kind == "preempted":
        msg = f"{outcome.message}; {devices} device(s) left{note}"
        db.add_event(run_id, "preemption", msg, {"lost_nodes": lost, "devices": devices, "ts": now})
        grow_to = pool_devices(spec) - skip
        if backend == "local" and grow_to > devices:
            _regrow_later(spec.elasticity, db, run_id, grow_to, now)
    _morph_event(db, run_id, plan, next_plan, outcome, note, left_out, now)
    return next_plan


def _morph_event(
    db: StateDB,
    run_id: str,
    plan: Plan,
    new: Plan,
    outcome: Outcome,
    note: str,
    left_out: list[int],
    now: float,
) -> None:
    """The ``morph`` event: from how many devices to how many, why, who was left out."""
    msg = (
        f"{plan.world_size} -> {new.world_size} device(s) ({outcome.message.splitlines()[0]}){note}"
    )
    data = {"from": plan.world_size, "to": new.world_size, "kind": outcome.kind}
    db.add_event(run_id, "morph", msg, {**data, "excluded_nodes": left_out, "ts": now})


def _regrow_later(el: ElasticitySpec, db: StateDB, run_id: str, devices: int, now: float) -> None:
    """Lost slots count as free again ``elasticity.regrow_backoff_s`` after ``now``:
    leave a request to grow back to ``devices`` at the first checkpoint after that."""
    back = now + el.regrow_backoff_s
    write_request(db.runs_dir / run_id, ScaleRequest(devices, "capacity returned", back, True))
    db.add_event(
        run_id,
        "capacity",
        f"lost slot(s) free again after {el.regrow_backoff_s:.0f} s: growing back "
        f"to {devices} device(s) at the first checkpoint after that",
        {"devices": devices, "not_before": back},
    )
