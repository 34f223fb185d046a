"""What a user sees when a job spec is wrong: positioned issues, the error, suggestions."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class SpecIssue:
    """One problem in a job spec, positioned in its file (line and column are 1-based).

    ``line`` and ``column`` are None when the problem has no place in the file, e.g. a
    value that came from an override or a file that could not be read.
    """

    file: str
    line: int | None
    column: int | None
    path: str
    message: str
    suggestion: str | None = None
    fix: str | None = None

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}:{self.column}"
        text = f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"
        if self.suggestion is not None:
            text += f" (did you mean '{self.suggestion}'?)"
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


class SpecError(Exception):
    """A job spec failed to load; ``errors`` holds every issue found, in file order."""

    def __init__(self, errors: list[SpecIssue]) -> None:
        self.errors = sorted(errors, key=_file_order)
        super().__init__("\n".join(str(issue) for issue in self.errors))

    def __reduce__(self) -> tuple[type[SpecError], tuple[list[SpecIssue]]]:
        # Rebuild from the issues (not the message) so the error survives pickling,
        # e.g. when raised in a worker process.
        return (type(self), (self.errors,))


def _file_order(issue: SpecIssue) -> tuple[bool, int, int]:
    return (issue.line is None, issue.line or 0, issue.column or 0)


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate nearest to ``word`` (ignoring case), or None if none is close."""
    options = list(candidates)
    by_lower = {option.lower(): option for option in options}
    if word.lower() in by_lower:
        return by_lower[word.lower()]
    matches = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[matches[0]] if matches else None


def dotted(path: Iterable[str | int]) -> str:
    """Render a key path as ``hardware.hosts[1].name``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text
