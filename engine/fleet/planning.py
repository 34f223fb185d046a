"""Planning a fleet: each member's plan, what it changes against the base, what it costs.

Each member is planned for its own hardware pool with :func:`make_plan`; the devices
its plan uses are what the fleet runner reserves for it in the shared pool. Predicted
cost and time of a member are its plan's dollars and wall time to finish
(``planner.cost``); the fleet's total is their sum, held to ``max_total_usd``; the
makespan is the runner's own admission rule replayed with the predicted durations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from jobctl.engine.core.plan import Plan
from jobctl.engine.fleet.db import FleetDB, MemberRecord
from jobctl.engine.fleet.loader import Fleet, Member, MemberIssue
from jobctl.engine.fleet.runner import admit
from jobctl.engine.planner.resolver import PlanError, make_plan
from jobctl.spec import JobSpec, SpecError, SpecIssue, dump_yaml


@dataclass(frozen=True)
class MemberPlan:
    """A member, its plan and what the plan predicts for the whole run."""

    member: Member
    plan: Plan
    changes: list[tuple[str, Any, Any]]  # (dotted field, base value, member value)

    @property
    def devices(self) -> int:
        return self.plan.world_size

    @property
    def samples(self) -> int:
        spec = self.member.spec
        return spec.training.steps * spec.training.global_batch_size

    @property
    def duration_s(self) -> float | None:
        """Wall time to finish (planner.cost: start-up where measured on this machine,
        every step, checkpoints, expected preemptions)."""
        pr = self.plan.prediction
        if pr is None:
            return None
        return (
            pr.finish_s if pr.finish_s is not None else pr.total_s(self.member.spec.training.steps)
        )

    @property
    def cost_usd(self) -> float | None:
        """Dollars to finish (planner.cost), at the price the member pays."""
        pr = self.plan.prediction
        if pr is None:
            return None
        return (
            pr.finish_usd
            if pr.finish_usd is not None
            else pr.cost_per_1k_samples * self.samples / 1000
        )


@dataclass(frozen=True)
class FleetPlan:
    """Every member's plan, the pool they share and the predicted totals."""

    fleet: Fleet
    members: list[MemberPlan]
    pool: int
    max_concurrent: int

    @property
    def total_cost_usd(self) -> float:
        return sum(m.cost_usd or 0.0 for m in self.members)

    @property
    def makespan_s(self) -> float:
        """Predicted wall time: members admitted as the runner would, in file order."""
        running: list[tuple[float, MemberPlan]] = []  # (end time, member)
        pending, now = list(self.members), 0.0
        while pending or running:
            busy = sum(m.devices for _, m in running)
            wanted = [(m.member.name, m.devices) for m in pending]
            for name in admit(wanted, busy, len(running), self.pool, self.max_concurrent):
                m = next(p for p in pending if p.member.name == name)
                pending.remove(m)
                running.append((now + (m.duration_s or 0.0), m))
            if not running:  # nothing fits: cannot happen for a planned fleet
                break
            running.sort(key=lambda r: r[0])
            now, _ = running.pop(0)
        return now


def pool_of(fleet: Fleet) -> int:
    """Devices the members share: the fleet file's ``pool_devices`` or the base's pool."""
    return fleet.spec.pool_devices or fleet.base.hardware.devices


def plan_fleet(fleet: Fleet, max_concurrent: int | None = None) -> FleetPlan:
    """Plan every member; raises :class:`SpecError` naming each member that cannot run."""
    pool = pool_of(fleet)
    plans, issues = [], []
    for m in fleet.members:
        try:
            plan = make_plan(m.spec)
        except (PlanError, ValueError) as e:
            issues.append(_issue(fleet, m, "parallelism", f"cannot plan: {e}"))
            continue
        if plan.world_size > pool:
            message = f"needs {plan.world_size} devices, the fleet's pool has {pool}"
            issues.append(_issue(fleet, m, "hardware", message))
            continue
        plans.append(MemberPlan(m, plan, diff(fleet.base, m.spec)))
    if issues:
        raise SpecError(issues)
    limit = max_concurrent or fleet.spec.max_concurrent or len(plans)
    fp = FleetPlan(fleet, plans, pool, limit)
    over = over_budget(fp)
    if over is not None:
        raise SpecError([over])
    return fp


def over_budget(fp: FleetPlan) -> SpecIssue | None:
    """The issue of a fleet predicted above its ``max_total_usd``, naming the dearest
    members; None within it (or with no budget)."""
    cap, total = fp.fleet.spec.max_total_usd, fp.total_cost_usd
    if cap is None or total <= cap:
        return None
    dear = sorted(fp.members, key=lambda m: -(m.cost_usd or 0.0))[:3]
    shown = ", ".join(f"{m.member.name} ${m.cost_usd or 0.0:.4g}" for m in dear)
    text = fp.fleet.path.read_text() if fp.fleet.path.exists() else ""
    found = re.search(r"^max_total_usd\s*:", text, re.MULTILINE)
    line = text.count("\n", 0, found.start()) + 1 if found else None
    return SpecIssue(
        str(fp.fleet.path),
        line,
        1 if found else None,
        "max_total_usd",
        f"the members are predicted to cost ${total:.4g} to finish, over max_total_usd "
        f"${cap:g} (dearest: {shown})",
        fix="raise max_total_usd, drop members, or give members a cheaper plan "
        "(planner.objective: cost, fewer training.steps)",
    )


def record_fleet(fleets: FleetDB, fp: FleetPlan, now: float) -> None:
    """Write the planned fleet to the state DB, every member pending."""
    records = [
        MemberRecord(
            m.member.name, m.member.index, m.devices, m.member.params, dump_yaml(m.member.spec)
        )
        for m in fp.members
    ]
    name, file = fp.fleet.spec.name, str(fp.fleet.path.resolve())
    fleets.create(name, file, fp.pool, fp.max_concurrent, records, now)


def _issue(fleet: Fleet, m: Member, path: str, message: str) -> MemberIssue:
    return MemberIssue(str(fleet.path), None, None, path, message, member=m.name)


def diff(base: JobSpec, member: JobSpec) -> list[tuple[str, Any, Any]]:
    """The dotted fields whose values differ (the name aside), in spec order."""
    a, b = (
        _flat(base.model_dump(mode="json", by_alias=True)),
        _flat(member.model_dump(mode="json", by_alias=True)),
    )
    keys = list(a) + [k for k in b if k not in a]
    return [(k, a.get(k), b.get(k)) for k in keys if k != "name" and a.get(k) != b.get(k)]


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: data}
