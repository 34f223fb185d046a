"""What one firing of a schedule does: decide, under a lease, whether to resume the job.

A trigger records itself, then: if the job's lease is live (a scheduler runs it) it does
nothing; otherwise it claims the lease and judges the job. Complete: nothing to do (and
it says so). Running, judged robustly (a live phase *and* a live supervisor: the child a
previous lease recorded, still alive on this host, which is then adopted; or the run's
local node processes; or a launch or morph in progress within the lease time): nothing.
Otherwise it starts ``jobctl resume RUN`` (or ``jobctl apply SPEC`` for a job that has
never run) as a child process logging under ``<home>/scheduler/logs``; ``tick`` renews
the lease while the child runs and records the outcome and releases it when it exits.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml
from rich.console import Console

from jobctl.engine.core.phases import Phase
from jobctl.engine.core.process import process_token
from jobctl.engine.recurring.procs import (
    Child,
    ForeignChild,
    Spawn,
    hostname,
    jobctl_argv,
    pid_alive,
    spawn_logged,
    stop_child,
)
from jobctl.engine.state.db import StateDB
from jobctl.engine.state.leases import JobEvents, Lease, Leases

DONE = {Phase.COMPLETED.value}
RESUMABLE = {Phase.FAILED.value, Phase.STOPPED.value}
# Phases in which the supervisor may legitimately have no node processes for a moment.
TRANSITIONAL = {
    p.value
    for p in (Phase.PENDING, Phase.CALIBRATING, Phase.PLANNING, Phase.LAUNCHING, Phase.MORPHING)
}


@dataclass(frozen=True)
class Decision:
    """The verdict on a job: ``launch`` argv, ``adopt`` a live orphan, or ``skip``."""

    action: str
    kind: str
    reason: str
    argv: tuple[str, ...] = ()
    child: Child | None = None


class Trigger:
    """Fires schedules for one scheduler process and looks after the runs it starts."""

    def __init__(
        self,
        db: StateDB,
        *,
        ttl_s: float = 60.0,
        clock: Callable[[], float] = time.time,
        spawn: Spawn = spawn_logged,
        stop: Callable[[Child], None] = stop_child,
        console: Console | None = None,
    ) -> None:
        self.db = db
        self.ttl_s = ttl_s
        self.clock = clock
        self.spawn = spawn
        self.stop = stop
        self.console = console
        self.host, self.pid = hostname(), os.getpid()
        self.owner = f"{self.host}:{self.pid}:{os.urandom(3).hex()}"
        self.leases = Leases(db)
        self.events = JobEvents(db, "scheduler", self.owner)
        self.children: dict[str, Child] = {}

    def fire(self, job: str, spec: str | None = None, scheduled: datetime | None = None) -> str:
        """Handle one due trigger of ``job``; returns the kind of outcome recorded."""
        when = f"scheduled {scheduled:%Y-%m-%d %H:%M:%S %Z}" if scheduled else "manual"
        self.record(job, "trigger", f"trigger ({when})")
        if job in self.children:
            pid = self.children[job].pid
            return self.record(job, "skip", f"running: pid {pid}, started by this scheduler")
        now = self.clock()
        prev = self.leases.get(job)
        if prev is not None and prev.live(now):
            return self.record(job, "skip", f"running: lease held by {prev.owner}")
        if not self.leases.claim(job, self.owner, self.host, self.pid, now, self.ttl_s):
            return self.record(job, "skip", "running: another scheduler claimed it first")
        decision = self.judge(job, spec, prev)
        if decision.action == "skip":
            self.leases.release(job, self.owner, self.clock())
            return self.record(job, decision.kind, decision.reason)
        return self._run(job, decision)

    def _run(self, job: str, decision: Decision) -> str:
        """Start (or adopt) the child the decision names, under the lease we hold."""
        child, data = decision.child, {}
        if child is None:
            stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self.clock()))
            log = self.db.home / "scheduler" / "logs" / f"{job}-{stamp}.log"
            try:
                child = self.spawn(decision.argv, log)
            except OSError as e:
                self.leases.release(job, self.owner, self.clock())
                return self.record(job, "error", f"cannot start {decision.reason}: {e}")
            data = {"argv": list(decision.argv), "log": str(log)}
        self.leases.attach(job, self.owner, child.pid, process_token(child.pid))
        self.children[job] = child
        where = f", log {data['log']}" if data else ""
        message = f"{decision.reason}: pid {child.pid}{where}"
        return self.record(job, decision.kind, message, {"pid": child.pid, **data})

    def missed(self, job: str, scheduled: datetime, late_s: float) -> None:
        """A trigger that came later than its misfire grace time: recorded, not run."""
        self.record(
            job,
            "missed",
            f"missed the {scheduled:%Y-%m-%d %H:%M:%S %Z} trigger by {late_s:.0f} s "
            "(beyond misfire_grace_time); waiting for the next one",
        )

    def judge(self, job: str, spec: str | None, prev: Lease | None) -> Decision:
        """Complete, running, or to be resumed (or first applied)?"""
        run = self.db.get_run(job)
        if run is not None and run["phase"] in DONE:
            step = f"{run['step'] or 0}/{run['total_steps'] or '?'}"
            reason = f"run {run['id']} is complete (step {step}); nothing to do"
            return Decision("skip", "complete", reason)
        if (
            prev is not None
            and prev.host == self.host
            and pid_alive(prev.child_pid, prev.child_token)
        ):
            orphan = ForeignChild(prev.child_pid, prev.child_token)
            reason = f"running: adopted pid {orphan.pid} left by {prev.owner}"
            return Decision("adopt", "adopt", reason, child=orphan)
        if run is not None and self._supervised(run):
            return Decision("skip", "skip", f"running: run {run['id']} is {run['phase']}")
        home = str(self.db.home)
        if run is not None:
            argv = jobctl_argv("resume", run["id"], "--home", home)
            return Decision("launch", "launch", f"resuming run {run['id']} ({run['phase']})", argv)
        if spec is not None:
            argv = jobctl_argv("apply", spec, "--home", home)
            return Decision("launch", "launch", f"first run from {spec}", argv)
        return Decision("skip", "error", "nothing to run: no run of this job and no spec file")

    def _supervised(self, run: dict) -> bool:
        """A live phase with a live supervisor (nodes alive, or a launch in progress)."""
        phase = run["phase"]
        if phase in DONE or phase in RESUMABLE:
            return False
        if phase in TRANSITIONAL and self.clock() - run["updated_at"] < self.ttl_s:
            return True
        if _backend(run) != "local":  # node handles are not local pids: only leases tell
            return False
        pids = [int(p) for p in (run["pids"] or "").split(",") if p.strip().isdigit()]
        return any(pid_alive(p) for p in pids)

    def tick(self) -> None:
        """Renew the leases of live children; record and release those that exited."""
        for job, child in list(self.children.items()):
            now = self.clock()
            if child.poll() is None:
                if not self.leases.renew(job, self.owner, now, self.ttl_s):
                    self._lost(job, child)
                continue
            del self.children[job]
            self.leases.release(job, self.owner, now)
            self.record(job, "exit", self._outcome(job, child), {"exit_code": child.poll()})

    def _lost(self, job: str, child: Child) -> None:
        # Our lease expired and someone else took it, so they may be starting a copy:
        # stopping ours keeps "never two copies" true (the run resumes from a checkpoint).
        del self.children[job]
        self.stop(child)
        self.record(job, "lease-lost", f"lease lost; stopped pid {child.pid} to avoid a copy")

    def _outcome(self, job: str, child: Child) -> str:
        code = child.poll()
        run = self.db.get_run(job)
        how = f"pid {child.pid} exited" + (f" with code {code}" if code not in (None, -1) else "")
        if run is None:
            return f"{how}; no run recorded"
        step = f"{run['step'] or 0}/{run['total_steps'] or '?'}"
        return f"{how}; run {run['id']} is {run['phase']} at step {step}"

    def shutdown(self) -> None:
        """Leave children running: their leases expire and the next scheduler adopts them."""
        for job, child in self.children.items():
            self.record(job, "detach", f"scheduler stopping; pid {child.pid} keeps running")
        self.children.clear()

    def record(self, job: str, kind: str, message: str, data: dict | None = None) -> str:
        """Add a scheduler event for ``job`` (echoed to the console); returns ``kind``."""
        now = self.clock()
        self.events.add(job, kind, message, now, data)
        if self.console is not None:
            stamp = datetime.fromtimestamp(now, timezone.utc).astimezone().strftime("%H:%M:%S")
            self.console.print(f"{stamp} {job}: {kind}: {message}", highlight=False, markup=False)
        return kind


def fire(
    job: str,
    spec: str | None = None,
    *,
    trigger: Trigger | None = None,
    scheduled: datetime | None = None,
    rule: str | None = None,
) -> str:
    """The callable every persisted schedule names; ``jobctl scheduler run`` calls it
    with its :class:`Trigger` (the leases and children of that process). ``rule`` is
    the schedule's rule as stored (engine/recurring/store), which the trigger already
    follows."""
    if trigger is None:
        raise TypeError("fire() runs inside `jobctl scheduler run`, which passes its Trigger")
    return trigger.fire(job, spec, scheduled)


def _backend(run: dict) -> str:
    """The backend a run was launched with, from its recorded spec (local if unknown)."""
    path = Path(run["run_dir"]) / "spec.yaml"
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return "local"
    hardware = data.get("hardware") if isinstance(data, dict) else None
    return hardware.get("backend", "local") if isinstance(hardware, dict) else "local"
