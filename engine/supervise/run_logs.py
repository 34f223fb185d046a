"""A run's worker logs for ``jobctl logs``: where each ``*.log`` file is now.

Nodes on this machine or a shared file system write into the run folder; nodes that
write on their own machines (ssh, Kubernetes) have their copies fetched by their
backend when asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LogFiles:
    """The run's log files by name, and why the nodes' copies are missing, if they are."""

    files: dict[str, Path]
    warning: str | None = None


def find_logs(row: dict) -> LogFiles:
    """The run's ``*.log`` files by name: the run folder's, and for nodes that write on
    their own machines (ssh, Kubernetes) the copies their backend fetches now; the run
    folder's copy wins (on a shared file system it is the live one)."""
    run_dir = Path(row["run_dir"])
    found: dict[str, Path] = {}
    warning = None
    backend = row["backend"] or "local"
    if backend in ("ssh", "kubernetes"):
        # The backends (jinja2, the spec) only for the nodes that need them fetched:
        # `jobctl logs` of a local run starts without them.
        from jobctl.backends import BackendError, get_backend

        handles = [h for h in (row["pids"] or "").split(",") if h]
        try:
            found = {
                p.name: p for p in get_backend(backend).logs(handles, run_dir) if p.suffix == ".log"
            }
        except BackendError as e:
            warning = f"the nodes' logs were not fetched: {e}"
    found.update({p.name: p for p in (run_dir / "logs").glob("*.log")})
    return LogFiles(found, warning)
