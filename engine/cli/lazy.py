"""The command table of ``jobctl``, loaded lazily: a command's module is imported only
when that command runs (or its own ``--help`` is asked for), so ``jobctl --help`` and
the commands that neither plan nor train never import torch.

``COMMANDS`` is the one list of commands, in the order of ``jobctl --help``, each with
the module and attribute that implement it and the one line ``--help`` shows (a unit
test keeps that line equal to the command's own docstring).
"""

from __future__ import annotations

import importlib

import typer

# typer >= 0.27 carries its own click (typer._click) and no longer installs click:
# every class here is typer's, so the placeholders and the loaded commands are one kind.
from typer.core import TyperCommand, TyperGroup

# name -> (module under jobctl.engine.cli, attribute, short help); an attribute that is
# a Typer app is a command group.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "validate": ("plan", "validate", "Check a job spec and print a one-line summary."),
    "schema": ("plan", "schema", "Print the job spec's JSON schema."),
    "plan": (
        "plan",
        "plan",
        "Resolve and print the parallel plan (P, D, micro-batching, stages, ranks, schedule).",
    ),
    "calibrate": (
        "calibrate",
        "calibrate",
        "Measure the model and this machine (Varuna Table 2) and cache the record.",
    ),
    "render": (
        "plan",
        "render",
        "Write the launch scripts to a folder that runs as written, without running anything.",
    ),
    "apply": (
        "apply",
        "apply",
        "Validate, plan, render, launch and supervise a job until it ends.",
    ),
    "resume": (
        "apply",
        "resume",
        "Continue a run: adopt its nodes if they still train (the "
        "supervisor died), else from its newest complete checkpoint, re-planned for "
        "the devices available now.",
    ),
    "fleet": ("fleet", "fleet_app", "Fleets: one templated job spec, many runs, one device pool."),
    "data": ("data", "data_app", "Prepare training data."),
    "schedule": ("schedule", "schedule_app", "Resume jobs on a cron rule or interval."),
    "scheduler": ("schedule", "scheduler_app", "The daemon that fires schedules."),
    "events": (
        "runs",
        "events",
        "Events of a job: its runs' phases and progress, and the "
        "scheduler's and fleet runner's decisions about it (triggers, skips, "
        "launches, exits).",
    ),
    "scale": (
        "scale",
        "scale",
        "Morph a running job onto DEVICES devices: checkpoint, re-plan, relaunch.",
    ),
    "report": (
        "report",
        "report",
        "Write an HTML page: throughput over time with morph, "
        "preemption, checkpoint and upload events marked, the loss curve and the "
        "simulated pipeline timeline.",
    ),
    "export": (
        "export",
        "export",
        "Write a run's trained weights as a Hugging Face model directory (from_pretrained).",
    ),
    "stop": (
        "runs",
        "stop",
        "Stop a run gracefully: every rank checkpoints at the end of its step, then exits.",
    ),
    "status": (
        "runs",
        "status",
        "Table of runs, or one run's details, ranks and recent events (--json, --watch).",
    ),
    "logs": (
        "runs",
        "logs",
        "Show a run's worker logs (all ranks, or one); -f follows until the run ends.",
    ),
}


def load_command(name: str) -> TyperCommand | TyperGroup:
    """The command ``name`` runs, its module imported now."""
    module, attr, _ = COMMANDS[name]
    target = getattr(importlib.import_module(f"jobctl.engine.cli.{module}"), attr)
    if isinstance(target, typer.Typer):
        cmd = typer.main.get_group(target)  # a group even with one command (data)
    else:
        single = typer.Typer()
        single.command(name=name)(target)
        cmd = typer.main.get_command(single)
    cmd.name = name
    return cmd


class _Placeholder(TyperCommand):
    """What ``jobctl --help`` and completion list for a command not loaded yet."""


class LazyGroup(TyperGroup):
    """The root group: every command of ``COMMANDS`` stands as a placeholder (name and
    short help) until it is resolved to run; then its module is imported."""

    def __init__(self, **attrs) -> None:
        super().__init__(**attrs)
        for name, (_, _, short) in COMMANDS.items():
            self.commands.setdefault(name, _Placeholder(name, help=short, short_help=short))

    def resolve_command(
        self, ctx: typer.Context, args: list[str]
    ) -> tuple[str | None, TyperCommand | TyperGroup | None, list[str]]:
        """The command to run (or complete the options of), its module imported now;
        listing the commands (``--help``, completing a name) never resolves one."""
        name, cmd, rest = super().resolve_command(ctx, args)
        if name is not None and isinstance(cmd, _Placeholder):
            cmd = self.commands[name] = load_command(name)
        return name, cmd, rest
