"""The interface every backend implements, and what rendering produces.

A backend turns a run (spec + plan + where things live) into ``Rendered`` artifacts
that print exactly what would be submitted (the dry run is part of the interface),
then submits, reports status, cancels and finds logs. jobctl never manages a cluster
itself: backends hand processes to torchrun, Slurm, Kubernetes or ssh.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class RunContext:
    """Everything a backend needs to render a run's launch artifacts."""

    run_id: str
    run_dir: Path
    nnodes: int
    nproc_per_node: list[int]
    rdzv_endpoint: str
    env: dict[str, str] = field(default_factory=dict)
    threads: int = 1
    python: str = sys.executable
    max_restarts: int = 0


@dataclass(frozen=True)
class Rendered:
    """Files a backend would write and submit: name -> content."""

    backend: str
    files: dict[str, str]

    def write(self, out_dir: Path) -> list[Path]:
        """Write every artifact into ``out_dir`` (scripts made executable)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, text in self.files.items():
            path = out_dir / name
            path.write_text(text)
            if name.endswith(".sh"):
                path.chmod(0o755)
            paths.append(path)
        return paths


class Backend(Protocol):
    """What jobctl asks of a place that runs processes."""

    name: str

    def render(self, ctx: RunContext) -> Rendered: ...

    def submit(self, rendered: Rendered, ctx: RunContext) -> list[int]: ...

    def poll(self, handles: list[int]) -> list[int | None]: ...

    def cancel(self, handles: list[int]) -> None: ...
