"""Rich renderings of fleets: the plan with diffs and costs, member status, progress."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from jobctl.engine.fleet.planning import FleetPlan
from jobctl.engine.views.markup import styled


def _value(v: Any) -> str:
    return "-" if v is None else str(v)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def print_fleet_plan(console: Console, fp: FleetPlan) -> None:
    """One row per member (changes vs the base, layout, predictions) and the totals."""
    fleet = fp.fleet
    _print_heading(
        console,
        f"{fleet.spec.name}: {len(fp.members)} member(s) from {fleet.path}",
        fp.pool,
        fp.max_concurrent,
        f"changes against the {fleet.base_label}",
    )
    t = Table("member", "changes", "plan", "dev", "s/step", "samples/s", "$/1k", "time", "$")
    for m in fp.members:
        pr = m.plan.prediction
        changes = "\n".join(f"{k}: {_value(a)} -> {_value(b)}" for k, a, b in m.changes)
        t.add_row(
            m.member.name,
            changes or "(none)",
            m.plan.summary(),
            str(m.devices),
            f"{pr.step_time_s:.4g}" if pr else "-",
            f"{pr.samples_per_s:.1f}" if pr else "-",
            f"{pr.cost_per_1k_samples:.3g}" if pr else "-",
            _duration(m.duration_s),
            f"{m.cost_usd:.3g}" if m.cost_usd is not None else "-",
        )
    console.print(t)
    device_h = sum((m.duration_s or 0.0) * m.devices for m in fp.members) / 3600
    console.print(
        styled(
            "[bold]total[/bold] {}",
            f"predicted ${fp.total_cost_usd:.3g} to finish {len(fp.members)} "
            f"member(s), {device_h:.3g} device-hours, about {_duration(fp.makespan_s)} end to end"
            + _budget(fp.fleet.spec.max_total_usd),
        ),
        highlight=False,
    )
    print_sources(console, [m.plan for m in fp.members])


def _budget(cap: float | None) -> str:
    return "" if cap is None else f"; fleet budget ${cap:g} (max_total_usd)"


def print_sources(console: Console, plans: list) -> None:
    """Whether the times include a measured start-up, and what the predictions rest on."""
    measured = [p.prediction.startup_s for p in plans if p.prediction]
    if any(s is None for s in measured):
        console.print(
            "times exclude start-up: not measured on this machine yet (the first run measures it)",
            highlight=False,
        )
    else:
        console.print(
            f"times include each member's start-up, {max(measured):.0f} s at most "
            "(measured by earlier runs here)",
            highlight=False,
        )
    analytic = [p for p in plans if p.prediction and p.prediction.source == "analytic"]
    if analytic:
        hint = (
            ": on a CPU often several times optimistic; `jobctl calibrate JOB.yaml` "
            "measures this machine"
            if any(p.device == "cpu" for p in analytic)
            else ""
        )
        console.print(
            styled(
                "[yellow]prediction source: analytic[/yellow] for {} member(s){}",
                len(analytic),
                hint,
            ),
            highlight=False,
        )


def print_fleet_status(console: Console, fleet: dict, rows: list[dict], runner: str) -> None:
    """The fleet's state and a table of its members (engine/fleet/members.py)."""
    _print_heading(
        console,
        f"{fleet['name']} ({fleet['file']}): {fleet['state']}",
        fleet["pool_devices"],
        fleet["max_concurrent"],
        f"runner {runner}",
    )
    t = Table("member", "state", "phase", "step", "loss", "dev", "launches", "time", "run")
    for r in rows:
        run = r["run"] or {}
        end = r["ended_at"] or (time.time() if r["state"] == "running" else None)
        took = end - r["started_at"] if end and r["started_at"] else None
        t.add_row(
            r["member"],
            r["state"],
            run.get("phase", "-"),
            f"{run.get('step') or 0}/{run.get('total_steps') or '?'}" if run else "-",
            f"{run['loss']:.4f}" if run.get("loss") is not None else "-",
            str(r["devices"]),
            str(r["launches"]),
            _duration(took),
            run.get("id", "-"),
        )
    console.print(t)


class FleetProgress:
    """A live progress bar per member, fed by the runner's ticks."""

    def __init__(self, console: Console) -> None:
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.fields[state]}"),
            TextColumn("loss {task.fields[loss]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self.tasks: dict[str, TaskID] = {}

    def __enter__(self) -> FleetProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def update(self, rows: list[dict]) -> None:
        """Each member's bar from its row joined with its run (engine/fleet/members.py)."""
        for r in rows:
            run = r["run"] or {}
            if r["member"] not in self.tasks:
                self.tasks[r["member"]] = self.bar.add_task(
                    r["member"], total=None, state="", loss="-"
                )
            self.bar.update(
                self.tasks[r["member"]],
                total=run.get("total_steps"),
                completed=run.get("step") or 0,
                state=r["state"] + (f"/{run['phase']}" if run else ""),
                loss=f"{run['loss']:.4f}" if run.get("loss") is not None else "-",
            )


def _print_heading(console: Console, what: str, pool: int, at_once: int, tail: str) -> None:
    """The fleet's one-line heading: what it is, its pool, how many run at once."""
    console.print(
        styled(
            "[bold]fleet[/bold] {}, pool {} device(s), at most {} at once; {}",
            what,
            pool,
            at_once,
            tail,
        ),
        highlight=False,
    )
