"""Backend errors at the command line: one paragraph and exit 2, never a traceback.

A backend refuses a run before anything starts (a missing ``hardware.kubernetes.image``,
too few ``hardware.hosts``, a directive value that is not one word) or fails to hand it
over (``sbatch`` missing, the cluster refusing the job). Either way the user needs to
know what failed, which part of the spec it comes from, and what to change.
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console

from jobctl.backends import BackendError, Rendered, RunContext, get_backend

BACKENDS = "local, slurm, kubernetes, ssh"


def explain(spec_file: Path | str | None, backend: str, action: str, error: Exception) -> str:
    """The one-paragraph message for ``error`` raised while a backend did ``action``."""
    what = str(error).strip().rstrip(".")
    return (
        f"error: {spec_file}: the {backend} backend cannot {action} this run: {what}. "
        f"Fix: correct hardware.{backend} (or the hardware fields named above) in "
        f"{spec_file}, or pick another backend with hardware.backend / --backend "
        f"(valid: {BACKENDS}). Nothing was started."
    )


def exit_with(
    err: Console, spec_file: Path | str | None, backend: str, action: str, error: Exception
) -> NoReturn:
    """Print ``explain(...)`` on stderr and exit 2."""
    err.print(explain(spec_file, backend, action, error), highlight=False, markup=False)
    raise typer.Exit(2)


def render_or_exit(err: Console, spec_file: Path, backend: str, ctx: RunContext) -> Rendered:
    """The backend's artifacts for ``ctx``, or exit 2 with a clear message."""
    try:
        return get_backend(backend).render(ctx)
    except (BackendError, ValueError) as e:
        exit_with(err, spec_file, backend, "render", e)
