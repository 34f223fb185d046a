"""``jobctl data prepare``: tokenize a corpus into a token file (``data.source: tokens``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from jobctl.engine.cli.common import console, err
from jobctl.engine.views.markup import styled

data_app = typer.Typer(no_args_is_help=True, help="Prepare training data.")


@data_app.command("prepare")
def prepare(
    source: Annotated[
        Path, typer.Argument(help="corpus: .txt, .jsonl, .parquet, .arrow, or a dataset folder")
    ],
    tokenizer: Annotated[
        Path, typer.Option("--tokenizer", help="tokenizer folder (tokenizer.json or HF files)")
    ],
    out: Annotated[Path, typer.Option("--out", help="token file to write (.bin or .npy)")],
    column: Annotated[str, typer.Option("--column", help="text column of a dataset")] = "text",
    workers: Annotated[int, typer.Option("--workers", help="processes (0: one per core)")] = 0,
) -> None:
    """Tokenize SOURCE into a token file, in parallel over the cores; an interrupted run
    continues where it stopped when started again with the same arguments."""
    from jobctl.engine.data.hf import MissingExtra
    from jobctl.engine.data.prepare import Job
    from jobctl.engine.data.prepare import prepare as run_prepare

    for path, what in ((source, "SOURCE"), (tokenizer, "--tokenizer")):
        if not path.exists():
            err.print(styled("[red]error:[/red] {} {}: no such file or folder", what, path))
            raise typer.Exit(2)
    job = Job(str(source), str(tokenizer), str(out), column, workers)
    try:
        with _bar() as bar:
            task = bar.add_task("tokenizing", total=None, tokens=0)
            count = run_prepare(
                job,
                lambda done, total, n: bar.update(
                    task, completed=done, total=total, tokens=bar.tasks[task].fields["tokens"] + n
                ),
            )
    except (MissingExtra, ValueError) as e:
        err.print(styled("[red]error:[/red] {}", e), highlight=False)
        raise typer.Exit(2) from None
    console.print(f"wrote {out}: {count} tokens", highlight=False)


def _bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("chunks, {task.fields[tokens]:,} tokens"),
        TimeRemainingColumn(),
        console=err,
    )
