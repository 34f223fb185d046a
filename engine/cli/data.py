"""``jobctl data prepare``: tokenize a corpus into a token file (``data.source: tokens``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.text import Text

from jobctl.engine.cli.common import console, err
from jobctl.engine.views.markup import styled

data_app = typer.Typer(no_args_is_help=True, help="Prepare training data.")


@data_app.command("prepare")
def prepare(
    source: Annotated[
        Path, typer.Argument(help="corpus: .txt, .jsonl, .parquet, .arrow, or a dataset folder")
    ],
    out: Annotated[Path, typer.Option("--out", help="token file to write (.bin or .npy)")],
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            "--tokenizer",
            help="tokenizer folder (tokenizer.json or HF files); with --vocab-size, where "
            "the trained one goes (default: OUT's name + '-tokenizer')",
        ),
    ] = None,
    vocab_size: Annotated[
        int | None,
        typer.Option("--vocab-size", help="train a byte-level BPE of this many tokens on SOURCE"),
    ] = None,
    column: Annotated[str, typer.Option("--column", help="text column of a dataset")] = "text",
    workers: Annotated[int, typer.Option("--workers", help="processes (0: one per core)")] = 0,
) -> None:
    """Tokenize SOURCE into a token file, in parallel over the cores; an interrupted run
    continues where it stopped when started again with the same arguments. Without a
    tokenizer of your own, --vocab-size N trains one on SOURCE first."""
    from jobctl.engine.data.hf import MissingExtra
    from jobctl.engine.data.prepare import Job

    _exists(source, "SOURCE")
    _corpus(source)
    try:
        folder = _tokenizer(source, out, tokenizer, vocab_size, column)
        count = _tokenize(Job(str(source), str(folder), str(out), column, workers))
    except (MissingExtra, ValueError) as e:
        err.print(styled("[red]error:[/red] {}", e), highlight=False)
        raise typer.Exit(2) from None
    console.print(f"wrote {out}: {count} tokens", markup=False, highlight=False)


def _tokenize(job) -> int:
    """``job`` run under a progress bar (chunks and tokens); the tokens written."""
    from jobctl.engine.data.prepare import prepare as run_prepare

    with _bar() as bar:
        task = bar.add_task("tokenizing", total=None, tokens=0)

        def on_chunk(done: int, total: int, n: int) -> None:
            tokens = bar.tasks[task].fields["tokens"] + n
            bar.update(task, completed=done, total=total, tokens=tokens)

        return run_prepare(job, on_chunk)


def _exists(path: Path, what: str) -> None:
    if not path.exists():
        err.print(styled("[red]error:[/red] {} {}: no such file or folder", what, path))
        raise typer.Exit(2)


def _corpus(source: Path) -> None:
    """Exit 2 unless ``source`` is a regular file or a dataset folder: it is read with a
    plain open, which on a FIFO blocks until a writer comes (`data prepare FIFO` hung)
    and on a device never ends (#46 item 6)."""
    from jobctl.spec.files import special

    what = special(source, folder_ok=True)
    if what is not None:
        err.print(
            styled(
                "[red]error:[/red] SOURCE {} is {}, not a corpus file or folder; give a "
                "corpus file (.txt, .jsonl, .parquet, .arrow) or a dataset folder",
                source,
                what,
            )
        )
        raise typer.Exit(2)


def _tokenizer(
    source: Path, out: Path, folder: Path | None, vocab_size: int | None, column: str
) -> Path:
    """The tokenizer folder to use: the one given, or one trained on ``source``."""
    if vocab_size is None:
        if folder is None:
            raise ValueError(
                "no tokenizer: give --tokenizer DIR (tokenizer.json or a Hugging Face "
                "folder), or --vocab-size N to train one on SOURCE (or train on raw bytes "
                "with no tokenizer at all: data.source: text, model.vocab: 256)"
            )
        _exists(folder, "--tokenizer")
        return folder
    from jobctl.engine.data import bpe
    from jobctl.engine.data.prepare import documents

    bpe.check_vocab_size(vocab_size)
    folder = folder or out.with_name(out.stem + "-tokenizer")
    asked = {"source": str(source.resolve()), "column": column}
    if bpe.reusable(folder, asked, vocab_size):
        console.print(f"tokenizer: {folder} (trained earlier on SOURCE)", markup=False)
        return folder
    with err.status(Text(f"training a byte-level BPE of {vocab_size} tokens on {source}")):
        got = bpe.train(documents(str(source), column)[1], vocab_size, folder, asked)
    console.print(
        f"tokenizer: {folder}, byte-level BPE of {got} tokens trained on {source} "
        f"(train with model.vocab: {got} or more)",
        markup=False,
        highlight=False,
    )
    return folder


def _bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("chunks, {task.fields[tokens]:,} tokens"),
        TimeRemainingColumn(),
        console=err,
    )
