"""Adopt a live run after its supervisor died: re-attach instead of relaunching.

The workers do not need the supervisor while they train: the rendezvous store and the
event channel live in the run's detached run host (engine/channel/host.py), so a
SIGKILL of ``jobctl apply`` leaves training going and events landing in
``metrics.jsonl``. ``jobctl resume RUN`` (or ``apply`` of the unfinished job) then
finds the run host and every recorded node handle alive, and supervises the same
processes again (``engine/supervise/supervisor.py`` uses what is here): a new Monitor follows
the archive from just after the last step the dead supervisor recorded in the state
DB. Nothing is relaunched, so no step is trained twice. If the host or any node is
gone, it relaunches from the newest checkpoint as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

from jobctl.backends import BackendError, NodeStatus, get_backend
from jobctl.engine.channel.host import read_host
from jobctl.engine.core import event_schema
from jobctl.engine.core.events import Kind, read_metrics
from jobctl.engine.core.plan import Plan
from jobctl.engine.state.db import StateDB

ENDED = ("completed", "failed", "stopped")


class AdoptError(RuntimeError):
    """The run is still supervised by a live process."""


def archive_offset(metrics: Path, step: int | None) -> int:
    """Byte offset just after the last ``step`` event for ``step`` (0 if none)."""
    if not step or not metrics.exists():
        return 0
    offset, found = 0, 0
    with open(metrics, "rb") as f:
        for line in f:
            offset += len(line)
            if b'"step"' in line and line.endswith(b"\n"):
                rec = json.loads(line)
                if rec.get("kind") == Kind.STEP and rec.get("step") == step:
                    found = offset
    return found


class FinishedNodes:
    """A backend view for handles this process did not start (local pids of a dead
    supervisor): the exit code of a foreign process cannot be read, so a node whose
    ranks all logged their clean end (``rank R: done``) counts as succeeded."""

    def __init__(self, backend, run_dir: Path, plan: Plan):
        self.backend, self.run_dir, self.plan = backend, run_dir, plan
        self.name = backend.name

    def _done(self, node: int) -> bool:
        ranks = [r.rank for r in self.plan.ranks if r.node == node]
        for r in ranks:
            log = self.run_dir / "logs" / f"rank-{r}.log"
            tail = log.read_bytes()[-4096:] if log.exists() else b""
            if f"rank {r}: done".encode() not in tail:
                return False
        return bool(ranks)

    def status(self, handles: list[str]) -> list[NodeStatus]:
        out = self.backend.status(handles)
        if len(handles) != self.plan.nodes:
            return out
        return [
            NodeStatus("succeeded", 0, "all ranks done") if s.done and self._done(k) else s
            for k, s in enumerate(out)
        ]

    def poll(self, handles: list[str]) -> list[int | None]:
        return [s.exit_code for s in self.status(handles)]

    def __getattr__(self, name):
        return getattr(self.backend, name)


def live_run(db: StateDB, run_id: str):
    """(row, host, handles) when the run can be adopted, else None."""
    row = db.get_run(run_id)
    if row is None or row["phase"] in ENDED:
        return None
    run_dir = Path(row["run_dir"])
    host = read_host(run_dir)
    handles = [h for h in (row["pids"] or "").split(",") if h]
    if host is None or not host.alive() or not handles:
        return None
    if host.supervisor != os.getpid() and host.supervised():
        raise AdoptError(
            f"run {run_id} is still supervised by pid {host.supervisor}; "
            f"`jobctl status {run_id}` follows it, `jobctl stop {run_id}` stops it"
        )
    backend = get_backend(row["backend"] or "local")
    try:
        codes = backend.poll(handles)
    except BackendError:  # handles this process cannot ask about (ssh settings unknown)
        codes = None
    if codes is None or any(c is not None for c in codes):
        # Not every node is there: relaunch from the newest checkpoint, and first end what
        # is left of the old attempt (its survivors would keep writing to the archive).
        with contextlib.suppress(BackendError):
            backend.cancel(handles, signal.SIGKILL)
        host.stop()  # the store goes too: torchrun agents still waiting on it exit
        return None
    return row, host, handles, backend


def catch_up(db: StateDB, row: dict) -> dict:
    """Fold into the state DB what the run's workers wrote after the last record the
    dead supervisor read (they train on unsupervised): the newest step and its loss,
    the newest checkpoint and upload. Returns the run's row as it is then (#46 item 1:
    a run that finished unsupervised was relaunched and recorded as step 43 of 300)."""
    metrics = Path(row["run_dir"]) / "metrics.jsonl"
    recs, _ = read_metrics(metrics, archive_offset(metrics, row["step"]))
    recs = [r for r in recs if event_schema.problem(r) is None]
    steps = [r for r in recs if r["kind"] == Kind.STEP]
    fields: dict = {}
    if steps:
        last = steps[-1]  # the file's order: a rollback trains lower steps again
        fields.update(step=last["step"], loss=last["loss"], samples_per_s=last["samples_per_s"])
    for kind, name in ((Kind.CHECKPOINT, "last_checkpoint"), (Kind.UPLOADED, "last_upload")):
        found = [r["step"] for r in recs if r["kind"] == kind]
        if found and max(found) > (row[name] or -1):
            fields[name] = max(found)
    if fields:
        db.update_run(row["id"], **fields)
        said = ", ".join(f"{k} {v}" for k, v in fields.items() if k != "samples_per_s")
        db.add_event(row["id"], "caught_up", f"read what ran unsupervised: {said}", fields)
    return db.get_run(row["id"])


def finished_unsupervised(row: dict) -> bool:
    """Whether the run's newest checkpoint is its last step: it completed while no
    supervisor ran (the final checkpoint is written after the last step)."""
    total, ckpt = row.get("total_steps"), row.get("last_checkpoint")
    return total is not None and ckpt is not None and ckpt >= total
