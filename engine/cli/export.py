"""``jobctl export RUN --format hf --out DIR``: a run's trained weights as a model
directory that ``from_pretrained`` loads.

engine/checkpoint/export.py reads the newest complete checkpoint and writes it; this
command finds the run, asks, and prints one line (exit 2 when it cannot).
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from jobctl.engine.cli.common import HomeOpt, RunArg, console, err, find_run
from jobctl.engine.views.markup import styled


class Format(str, Enum):
    """The formats a run can be exported in."""

    hf = "hf"


def export(
    run: RunArg,
    out: Annotated[Path, typer.Option("--out", help="directory to write the model into")],
    fmt: Annotated[
        Format, typer.Option("--format", help="hf: a Hugging Face save_pretrained directory")
    ] = Format.hf,
    home: HomeOpt = None,
) -> None:
    """Write a run's trained weights as a Hugging Face model directory (from_pretrained).

    Reads the run's newest complete checkpoint (downloading it from checkpoint.remote
    if only the remote has it); the directory holds config.json and safetensors.
    """
    from jobctl.engine.checkpoint.export import ExportError, export_hf
    from jobctl.engine.state.db import StateDB
    from jobctl.spec import SpecError, load_spec

    row = find_run(StateDB(home), run)
    run_dir = Path(row["run_dir"])
    try:
        spec = load_spec(run_dir / "spec.yaml")
        done = export_hf(spec, run_dir, out)
    except SpecError as e:
        _fail(f"run {row['id']}: its spec.yaml cannot be read: {e}", None)
    except ExportError as e:
        _fail(f"run {row['id']}: cannot export: {e}", e.fix)
    summary = f"wrote {done.out} ({fmt.value}): {done.tensors} tensors from step {done.step}"
    console.print(summary, highlight=False)


def _fail(message: str, fix: str | None) -> NoReturn:
    err.print(styled("[red]error:[/red] {}", message), highlight=False)
    if fix:
        err.print(f"  fix: {fix}", highlight=False)
    raise typer.Exit(2)
