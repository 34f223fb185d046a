"""Test doubles for driving the supervisor without processes: a clock, a node backend
whose states the test sets, and a process launcher that starts nothing.

Only the process launcher is replaced (engine/supervise/attempt.py's seam): planning, rendering,
the state DB, the monitor and the phase machine are the real ones. The real launcher
is covered by the multi-process tests (test_chaos_*.py, test_adopt.py).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from rich.console import Console

from jobctl.backends.base import NodeStatus
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.attempt import Attempt
from jobctl.engine.supervise.service import ApplyOptions
from jobctl.engine.supervise.supervisor import Supervisor

from .jobrun import tiny_spec

RUNNING = NodeStatus("running")
SUCCEEDED = NodeStatus("succeeded", 0, "exit 0")
KILLED = NodeStatus("stopped", -9, "exit -9", "preempted")


class FakeClock:
    """Wall and monotonic time in one, advanced only by ``sleep``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Nodes:
    """A backend whose node states the test sets; it records every cancel."""

    name = "local"

    def __init__(self, handles: list[str]) -> None:
        self.state = dict.fromkeys(handles, RUNNING)
        self.cancels: list[tuple[list[str], int]] = []

    def status(self, handles):
        return [self.state[h] for h in handles]

    def poll(self, handles):
        return [s.exit_code for s in self.status(handles)]

    def cancel(self, handles, sig=signal.SIGTERM):
        self.cancels.append((list(handles), sig))
        if sig == signal.SIGKILL:
            for h in handles:
                if not self.state[h].done:
                    self.state[h] = NodeStatus("stopped", -9, "killed", "cancelled")

    def logs(self, handles, run_dir):
        return []

    def set_all(self, status: NodeStatus) -> None:
        self.state = dict.fromkeys(self.state, status)


class FakeLauncher:
    """Starts nothing: each attempt gets fresh handles on a ``Nodes`` backend."""

    def __init__(self) -> None:
        self.attempts: list[Attempt] = []
        self.ready_calls = 0

    def start(self, run, backend, secret, channel_port) -> Attempt:
        k = len(self.attempts)
        handles = [f"a{k}n{n}" for n in range(run.ctx.nnodes)]
        attempt = Attempt(run, Nodes(handles), handles)
        self.attempts.append(attempt)
        return attempt

    def ready(self, attempt: Attempt) -> None:
        self.ready_calls += 1

    @property
    def nodes(self) -> Nodes:
        """The latest attempt's backend."""
        return self.attempts[-1].backend


def elastic_spec(**extra):
    return tiny_spec(
        **{
            "training.steps": 6,
            "checkpoint.interval": 3,
            "elasticity.enabled": True,
            "elasticity.regrow_backoff_s": 3600,
            **extra,
        }
    )


def supervisor(tmp_path: Path, spec=None, run_id: str | None = None, **opts):
    """A supervisor of ``spec`` on fake time and a fake launcher; (sup, launcher, db, clock)."""
    spec = spec or elastic_spec()
    clock = FakeClock()
    db = StateDB(tmp_path / "home", clock=clock)
    launcher = FakeLauncher()
    options = ApplyOptions(show_progress=False, run_id=run_id, **opts)
    sup = Supervisor(
        spec, make_plan(spec), db, None, options, Console(quiet=True), launcher, clock, clock.sleep
    )
    return sup, launcher, db, clock


def write(run_dir: Path, *recs: dict) -> None:
    """Append worker records to the run's metrics.jsonl, as the run host does."""
    with open(run_dir / "metrics.jsonl", "a") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")


def step(n: int, ts: float) -> dict:
    return {"kind": "step", "step": n, "loss": 5.0 - n / 10, "samples_per_s": 100.0, "ts": ts}


def heartbeat(n: int, rank: int, node: int, ts: float) -> dict:
    return {
        "kind": "heartbeat",
        "step": n,
        "rank": rank,
        "stage": rank % 2,
        "node": node,
        "compute_s": 0.01,
        "ts": ts,
    }


def training_db(home: Path) -> StateDB:
    """The state DB in ``home`` with one run ``r`` that went through the phases to
    ``training``."""
    db = StateDB(home)
    db.create_run("r", "r", home)
    for phase in ("calibrating", "planning", "launching", "training"):
        db.set_phase("r", phase)
    return db


def phases(db: StateDB, run_id: str) -> list[str]:
    """The run's phase events, phase names only."""
    return [e["message"].split(":")[0] for e in db.events(run_id) if e["kind"] == "phase"]


def to_training(sup) -> list[str]:
    """Step from attach to the first poll; the phases each step returned."""
    return [sup.step() for _ in range(5)]
