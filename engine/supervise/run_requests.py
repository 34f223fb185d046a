"""Requests to a run from outside its supervisor: ``jobctl stop`` and ``jobctl scale``.

A supervised run gets a request through the state DB (stop) or its run folder (scale)
and its supervisor acts on it between two steps; a run nobody supervises is stopped
here (between two attempts) or its recorded nodes are signalled directly. What was
done comes back as data; the command line words it.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

from jobctl.backends import get_backend
from jobctl.engine.core.phases import STOPPABLE
from jobctl.engine.core.process import pid_alive
from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.scaling import ScaleRequest, check_devices, write_request
from jobctl.spec import SpecError, load_spec

ENDED = ("completed", "failed", "stopped")
LIVE = {"launching", "training", "pruning", "rebalancing", "checkpointing", "uploading"}
# Phases of a live run between two attempts: a request now would die with the old one.
BETWEEN = {"pending", "calibrating", "planning", "morphing"}


@dataclass(frozen=True)
class Stopping:
    """What a stop request did to the run ``run_id`` in ``phase``: ``how`` is
    ``ended`` (nothing: it already had), ``asked`` (its live supervisor, pid
    ``supervisor``, has its nodes checkpoint and stop), ``between`` (stopped here
    between two attempts) or ``signalled`` (SIGTERM sent to ``nodes`` nodes)."""

    run_id: str
    phase: str
    how: str
    supervisor: int | None = None
    nodes: int = 0


def request_stop(db: StateDB, row: dict) -> Stopping:
    """Stop the run in ``row`` gracefully: every rank checkpoints at the end of its step,
    then exits. Its live supervisor gets the request through the state DB and signals
    the nodes running at that moment (after a morph, the new ones), or stops the run
    there if it is between two attempts; without one the recorded nodes are signalled."""
    run_id, phase = row["id"], row["phase"]
    if phase in ENDED:
        return Stopping(run_id, phase, "ended")
    sup = row["supervisor_pid"]
    if sup and pid_alive(sup, row["supervisor_token"]):
        db.request_stop(run_id, f"stop requested from pid {os.getpid()}")
        _stopping(db, run_id, "the nodes checkpoint, then stop")
        return Stopping(run_id, phase, "asked", supervisor=sup)
    handles = [h for h in (row["pids"] or "").split(",") if h]
    if phase in BETWEEN or not handles:
        # Nobody supervising and no node recorded (between two attempts, or a launch
        # that died before any node started): nothing runs that could checkpoint.
        db.set_phase(run_id, "stopped", "stopped with no supervisor and no node running")
        return Stopping(run_id, phase, "between")
    # SIGTERM reaches every node's torchrun agent, which forwards it to its workers.
    get_backend(row["backend"] or "local").cancel(handles, signal.SIGTERM)
    db.add_event(run_id, "stop", f"SIGTERM sent to {len(handles)} node(s) (no supervisor)")
    _stopping(db, run_id, "the nodes checkpoint, then stop (no supervisor records the end)")
    return Stopping(run_id, phase, "signalled", nodes=len(handles))


def _stopping(db: StateDB, run_id: str, note: str) -> None:
    """``status`` says ``stopping`` from the request until the run ends, where nodes
    run that can checkpoint (a run between two attempts stops at once)."""
    db.set_phase_if(run_id, {p.value for p in STOPPABLE}, "stopping", note)


class ScaleRefused(ValueError):
    """A scale request that cannot be honoured now; the message says why and what to do."""


def request_scale(row: dict, devices: int) -> None:
    """Leave a request to morph the run in ``row`` onto ``devices`` devices for its
    supervisor, or raise ScaleRefused. The request is checked on its own first (within
    elasticity.min_devices..max_devices and the hardware pool, and a layout fits): one
    the spec can never satisfy gets the same answer whatever the run is doing now."""
    spec_file = Path(row["run_dir"]) / "spec.yaml"
    try:
        spec = load_spec(spec_file)
    except (SpecError, FileNotFoundError) as e:
        raise ScaleRefused(f"{spec_file}: cannot read the run's spec: {e}") from None
    problem = check_devices(spec, devices)
    if problem is not None:
        raise ScaleRefused(f"cannot scale run {row['id']} ({spec_file}): {problem}")
    if row["phase"] in BETWEEN:
        raise ScaleRefused(
            f"run {row['id']} is {row['phase']} (between two attempts): run `jobctl scale "
            f"{row['id']} {devices}` again once `jobctl status {row['id']}` shows it training"
        )
    if row["phase"] not in LIVE:
        raise ScaleRefused(
            f"run {row['id']} is {row['phase']}, not running: `jobctl resume {row['id']} "
            f"--devices {devices}` continues it on {devices} device(s)"
        )
    write_request(Path(row["run_dir"]), ScaleRequest(devices, "jobctl scale"))
