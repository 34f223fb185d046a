"""The command table of ``jobctl``, loaded lazily: a command's module is imported only
when that command runs (or its own ``--help`` is asked for), so ``jobctl --help`` and
the commands that neither plan nor train never import torch.

``COMMANDS`` is the one list of commands, in the order of ``jobctl --help``, each with
the module and attribute that implement it and the one line ``--help`` shows (a unit
test keeps that line equal to the command's own docstring).
"""

from __future__ import annotations

import importlib
import re

import typer

# typer >= 0.27 carries its own click (typer._click) and no longer installs click:
# every class here is typer's, so the placeholders and the loaded commands are one kind.
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

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
        single = typer.Typer(add_completion=False)  # completion is the root's alone
        single.command(name=name)(target)
        cmd = typer.main.get_command(single)
    cmd.name = name
    return plain_help(cmd)


def plain_text(doc: str | None) -> str | None:
    """A docstring as help text: reST's double backquotes dropped, and the line breaks
    inside a paragraph joined, so the terminal wraps it at its own width (#47: `one`
    alone on a line at 80 columns)."""
    if doc is None:
        return None
    return re.sub(r"(?<=\S)[ \t]*\n[ \t]*(?=\S)", " ", doc.replace("``", ""))


class PlainArgument(TyperArgument):
    """An argument whose usage reads SPEC_FILE, or [RUN] when optional (typer's own
    usage reads ``{spec_file}``)."""

    def _usage_display_name(self) -> str:
        name = self.display_name_raw
        name = name if self.required else f"[{name}]"
        return name + ("..." if self.nargs != 1 else "")


def plain_param(param) -> None:
    """An argument named in capitals (SPEC_FILE); an on/off flag with no ``<bool>``."""
    if isinstance(param, TyperArgument) and param.metavar is None:
        param.metavar = (param.name or "").upper()
        param.__class__ = PlainArgument
    elif isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
        param.metavar = ""  # a flag takes no value: its type column stays empty


def plain_help(cmd: TyperCommand | TyperGroup) -> TyperCommand | TyperGroup:
    """``cmd`` and its subcommands as ``--help`` should read them: plain help text and
    ``plain_param``'s names, ``--help`` (made per context) included."""
    cmd.help = plain_text(cmd.help)
    params = cmd.get_params  # the instance's, bound

    def get_params(ctx):
        got = params(ctx)
        for param in got:
            plain_param(param)
        return got

    cmd.get_params = get_params
    for sub in getattr(cmd, "commands", {}).values():
        if not isinstance(sub, _Placeholder):
            plain_help(sub)
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

    def get_params(self, ctx: typer.Context) -> list:
        """The root's options (--version, completion, --help) as plain_param reads them."""
        got = super().get_params(ctx)
        for param in got:
            plain_param(param)
        return got

    def resolve_command(
        self, ctx: typer.Context, args: list[str]
    ) -> tuple[str | None, TyperCommand | TyperGroup | None, list[str]]:
        """The command to run (or complete the options of), its module imported now;
        listing the commands (``--help``, completing a name) never resolves one."""
        name, cmd, rest = super().resolve_command(ctx, args)
        if name is not None and isinstance(cmd, _Placeholder):
            cmd = self.commands[name] = load_command(name)
        return name, cmd, rest
