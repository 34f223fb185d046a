"""Find the checkpoint a run continues from: the newest complete one, local or remote.

Local checkpoints are verified against their manifest's sha256; a newer remote one is
downloaded (and verified on the way) into the local tier. Either must then load
(``engine/checkpoint/contents.py``: every shard opened as the workers open it, shapes
consistent). A corrupted or incomplete
checkpoint (a malformed manifest, a symbolic link) is skipped with a one-line logged
warning that says why, and the previous one is used: a bad upload never costs more than
one checkpoint interval.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

from jobctl.engine.checkpoint.contents import Shapes, content_problem, shape_problem
from jobctl.engine.checkpoint.store.checkpoint_store import CheckpointStore
from jobctl.engine.checkpoint.store.format import (
    CheckpointWarning,
    CorruptCheckpointError,
    IncompleteCheckpointError,
    step_dirname,
)
from jobctl.spec.phases import CheckpointSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumePoint:
    """A verified local checkpoint folder to continue from."""

    step: int
    path: Path
    source: str  # "local" or the remote URL it was downloaded from


def local_root(checkpoint: CheckpointSpec, run_dir: Path) -> Path:
    """Where a run's local checkpoints live."""
    return Path(checkpoint.local_dir or run_dir / "checkpoints")


def _complete_steps(store: CheckpointStore, verify: bool) -> list[int]:
    """Complete steps, newest first, skipping the bad ones with a one-line warning that
    says why (a malformed manifest, a symbolic link, a file of the wrong size)."""
    good = []
    for step in sorted(store.steps(), reverse=True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CheckpointWarning)
            problem = store.problem(step, verify=verify)
        if problem is None:
            good.append(step)
        else:
            log.warning("checkpoint %s step %d skipped: %s", store.url, step, problem)
    return good


def find_resume_point(checkpoint: CheckpointSpec, root: Path) -> ResumePoint | None:
    """Newest complete checkpoint of the job that its workers can load, downloading it
    if only the remote has it."""
    local = _complete_steps(CheckpointStore(str(root)), verify=True) if root.exists() else []
    opened = _Opened(root)
    best_local = next((s for i, s in enumerate(local) if opened.loads(s, local[i + 1 :])), None)
    if checkpoint.remote:
        remote = CheckpointStore(checkpoint.remote)
        for step in _complete_steps(remote, verify=False):
            if best_local is not None and step <= best_local:
                break
            try:
                path = remote.download(step, root)
            except CorruptCheckpointError as e:
                log.warning("remote step %d failed verification (%s); trying the previous", step, e)
                continue
            if opened.loads(step, [s for s in local if s < step]):
                return ResumePoint(step, path, checkpoint.remote)
    if best_local is None:
        return None
    return ResumePoint(best_local, root / step_dirname(best_local), "local")


class _Opened:
    """The contents of the checkpoints under ``root``, each opened once per search."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.seen: dict[int, tuple[str | None, Shapes]] = {}

    def contents(self, step: int) -> tuple[str | None, Shapes]:
        if step not in self.seen:
            self.seen[step] = content_problem(self.root / step_dirname(step))
        return self.seen[step]

    def loads(self, step: int, older: list[int]) -> bool:
        """Whether ``step`` loads, its shapes those of the newest of ``older`` that
        loads; if not, a warning that says why."""
        why, shapes = self.contents(step)
        like = next((sh for w, sh in map(self.contents, older) if w is None), None)
        why = why or shape_problem(shapes, like)
        if why is not None:
            log.warning("checkpoint %s step %d skipped: %s", self.root, step, why)
        return why is None


def committed_steps(checkpoint: CheckpointSpec, root: Path) -> list[int]:
    """The job's steps that were committed once (a manifest is there, valid or not),
    locally or remotely: where ``find_resume_point`` found none of them usable, the run
    must not silently start again at step 0 (#46 item 11)."""
    stores = [CheckpointStore(str(root))] if root.exists() else []
    if checkpoint.remote:
        stores.append(CheckpointStore(checkpoint.remote))
    found: set[int] = set()
    for store in stores:
        for step in store.steps():
            try:
                store.manifest(step)
            except IncompleteCheckpointError:
                continue  # never committed: an interrupted write, nothing was lost
            except CorruptCheckpointError:
                pass
            found.add(step)
    return sorted(found)


def none_usable(checkpoint: CheckpointSpec, root: Path) -> str | None:
    """Why a run that found no resume point may not start at step 0: it has committed
    checkpoints and every one failed its checks (the warnings logged say why)."""
    steps = committed_steps(checkpoint, root)
    if not steps:
        return None
    where = f"{root}" + (f" and {checkpoint.remote}" if checkpoint.remote else "")
    shown = ", ".join(map(str, steps[-5:])) + (" ..." if len(steps) > 5 else "")
    return (
        f"no checkpoint can be resumed from: {len(steps)} committed (steps {shown}) and "
        "every one failed its checks (the warnings say why); restore one, or move them "
        f"out of {where} to start again at step 0"
    )
