"""The ``data`` section: where training (and eval) samples come from.

Only what can be judged from the spec text is checked here; what needs the files (the
path exists, holds enough tokens, fits the model's vocabulary, has the text column) is
checked by ``jobctl.engine.data.checks`` at ``validate`` and ``plan``, before anything
starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import Field

from .base import SpecModel, Violation
from .errors import SpecIssue
from .source import parse_yaml

UINT16_VOCAB = 1 << 16
FILE_SOURCES = ("text", "tokens", "hf")


class DataSpec(SpecModel):
    """Where training samples come from."""

    source: Literal["synthetic", "text", "tokens", "hf"] = Field(
        "synthetic",
        description="'synthetic' random tokens; 'text' bytes of `path`; 'tokens' a flat file "
        "of token ids (.bin uint16/uint32 or .npy, local or any fsspec URL); 'hf' a dataset "
        "(save_to_disk folder, parquet, jsonl or arrow files) tokenized with `tokenizer`.",
    )
    path: str | None = Field(
        None,
        description="The data file or folder ('text', 'tokens', 'hf'); a relative path "
        "resolves against the spec file's folder; 'tokens' also takes fsspec URLs (s3://).",
    )
    dtype: Literal["auto", "uint16", "uint32"] = Field(
        "auto",
        description="Token id type of a .bin token file; 'auto': what the file proves "
        "(uint32 for a model.vocab above 65,536; uint16 when the file is not whole uint32 "
        "ids or its uint32 ids leave the vocab), else refused naming both readings. A "
        ".npy file carries its own.",
    )
    tokenizer: str | None = Field(
        None,
        description="Folder of the tokenizer for source 'hf' (tokenizer.json, or anything "
        "transformers.AutoTokenizer.from_pretrained reads).",
    )
    text_column: str = Field("text", description="The text column of an 'hf' dataset.")
    shuffle: bool = Field(
        True,
        description="Shuffle, seeded, anew every epoch ('tokens', 'hf'), by blocks: the "
        "sequences are cut into blocks of `block_mb` MB of consecutive ones; an epoch visits "
        "the blocks in a permutation drawn from (seed, epoch) and the sequences of each "
        "`shuffle_window` blocks in a permutation drawn from (seed, epoch, window). Every "
        "epoch reads each sequence once; the order depends on no P x D, resume or location.",
    )
    block_mb: float = Field(
        4.0,
        gt=0,
        description="Size of a shuffle block in MB ('tokens', 'hf'): a remote token file is "
        "read one block per ranged GET, a few blocks cached and the next ones read ahead.",
    )
    shuffle_window: int = Field(
        4,
        ge=1,
        description="Blocks whose sequences are shuffled together (more: a batch mixes more "
        "of the file; a remote reader holds 3x this many blocks).",
    )
    eval: str | float | None = Field(
        None,
        description="Validation split: a fraction in (0, 0.5] of the sequences held out from "
        "the end, or a path of the same kind as `path`; see training.eval_every.",
    )
    seed: int = Field(0, description="Seed of the synthetic token stream and of the shuffle.")

    def _violations(self) -> Iterator[Violation]:
        if self.source in FILE_SOURCES and self.path is None:
            example = {"text": "<file.txt>", "tokens": "<train.bin>", "hf": "<dataset dir>"}
            yield Violation(
                "path",
                f"source {self.source!r} needs a `path`",
                f"add data.path: {example[self.source]} next to source",
            )
        if self.source not in FILE_SOURCES and self.path is not None:
            yield Violation(
                "path",
                f"`path` is only read for sources {', '.join(FILE_SOURCES)}, but source is "
                f"{self.source!r}",
                "set data.source: tokens (or text, hf) or remove data.path",
            )
        yield from self._hf_violations()
        yield from self._eval_violations()

    def _hf_violations(self) -> Iterator[Violation]:
        if self.source == "hf" and self.tokenizer is None:
            yield Violation(
                "tokenizer",
                "source 'hf' needs a `tokenizer` folder to turn text into token ids",
                "add data.tokenizer: <folder with tokenizer.json> next to source",
            )
        if self.source != "hf" and self.tokenizer is not None:
            yield Violation(
                "tokenizer",
                f"`tokenizer` is only read for source 'hf', but source is {self.source!r}",
                "set data.source: hf or remove data.tokenizer (`jobctl data prepare` "
                "tokenizes a corpus into a token file)",
            )

    def _eval_violations(self) -> Iterator[Violation]:
        if self.eval is None:
            return
        if self.source not in ("tokens", "hf"):
            yield Violation(
                "eval",
                f"a validation split needs source 'tokens' or 'hf', but source is {self.source!r}",
                "remove data.eval or set data.source: tokens",
            )
        elif isinstance(self.eval, float) and not 0.0 < self.eval <= 0.5:
            yield Violation(
                "eval",
                f"eval fraction {self.eval} is outside (0, 0.5]",
                "hold out a fraction such as 0.05, or give a path to a separate file",
            )


def located(filename: str, violations: list[Violation]) -> list[SpecIssue]:
    """``violations`` (dotted paths from the spec's root) placed at their values' line and
    column in ``filename`` (the nearest section written there, for defaults)."""
    try:
        text = Path(filename).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    positions = parse_yaml(text, filename).positions
    issues = []
    for v in violations:
        path: tuple[str | int, ...] = tuple(v.path.split("."))
        while path and path not in positions:
            path = path[:-1]
        line, column = positions[path].value if path else (None, None)
        issues.append(SpecIssue(filename, line, column, v.path, v.message, fix=v.fix))
    return issues
