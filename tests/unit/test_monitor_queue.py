"""The monitor follows a batch job through its scheduler's queue: waiting shows as
launching with the reason, and a job that ran and waits again is a requeue (recorded,
and the next attempt is followed afresh), whether its ranks stopped gracefully or not.

The backend here replays a scripted sequence of ``status()`` answers (what squeue
says over time); the real Slurm path is in test_backend_slurm.py.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

from jobctl.backends.base import NodeStatus
from jobctl.engine.core.plan import Plan, RankPlan, StagePlan
from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.monitor import Monitor

RUNNING = NodeStatus("running", None, "RUNNING")
REQUEUED = NodeStatus("pending", None, "PENDING (BeginTime)")
DONE = NodeStatus("succeeded", 0, "COMPLETED")


class Replay:
    """A backend whose ``status`` answers come from a list, one per poll."""

    def __init__(self, answers: list[NodeStatus]) -> None:
        self.answers, self.cancels = list(answers), []

    def status(self, handles):
        return [self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]]

    def cancel(self, handles, sig):
        self.cancels.append(sig)

    def logs(self, handles, run_dir):
        return []


def _monitor(tmp_path, answers, total=4):
    db = StateDB(tmp_path / "home")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").touch()
    db.create_run("r", "r", run_dir, total_steps=total, devices=2)
    db.set_phase("r", "launching")
    db.set_phase("r", "training")
    run = SimpleNamespace(id="r", dir=run_dir, ctx=SimpleNamespace(nnodes=1), plan=two_ranks())
    backend = Replay(answers)
    return Monitor(run, backend, [0], db, total), backend, db


def two_ranks() -> Plan:
    """A real plan of the monitor's run: P = 1, D = 2 on one node, four blocks."""
    ranks = [RankPlan(rank=r, node=0, local_rank=r, stage=0, replica=r) for r in range(2)]
    stage = StagePlan(index=0, blocks=[0, 1, 2, 3], ranks=[0, 1], actions="")
    return Plan(
        P=1,
        D=2,
        micro_batch_size=1,
        micro_batches=2,
        global_batch_size=4,
        schedule="1f1b",
        nodes=1,
        processes_per_node=2,
        device="cpu",
        block_names=[f"b{i}" for i in range(4)],
        stages=[stage],
        ranks=ranks,
    )


def _write(run_dir, *recs):
    with open(run_dir / "metrics.jsonl", "a") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")


def _step(n):
    return {"kind": "step", "step": n, "loss": 1.0, "samples_per_s": 1.0, "ts": 0.0}


def test_requeue_without_a_graceful_stop_is_recorded_and_followed(tmp_path):
    # The job ran two steps, then the scheduler killed and requeued it (no SIGTERM
    # checkpoint: a node failure with requeue); it ran again from the checkpoint.
    mon, backend, db = _monitor(tmp_path, [RUNNING, REQUEUED, REQUEUED, RUNNING, DONE])
    _write(mon.run.dir, _step(1), _step(2))
    assert mon.poll_once() is None and mon.records.trained
    assert mon.poll_once() is None  # waiting again
    assert not mon.records.trained and not mon.ran  # a fresh attempt is followed
    assert db.get_run("r")["phase"] == "launching"
    assert mon.poll_once() is None
    assert mon.poll_once() is None and db.get_run("r")["phase"] == "training"
    _write(mon.run.dir, _step(3), _step(4))
    outcome = mon.poll_once()
    assert outcome is not None and outcome.ok
    kinds = [e["kind"] for e in db.events("r")]
    assert kinds.count("requeue") == 1 and kinds.count("queued") == 0
    assert backend.cancels == []  # nothing was killed along the way


def test_requeue_after_the_ranks_checkpointed_and_stopped(tmp_path):
    # SIGTERM from the scheduler: the ranks checkpoint, say so, and the job waits again.
    # The "stopped" records may be read only after the job shows pending.
    mon, backend, db = _monitor(tmp_path, [RUNNING, RUNNING, REQUEUED, RUNNING, DONE])
    _write(mon.run.dir, _step(1))
    assert mon.poll_once() is None
    _write(
        mon.run.dir,
        {"kind": "sigterm", "rank": 0, "node": 0, "ts": 0.0},
        {"kind": "checkpoint", "step": 2, "ts": 0.0},
    )
    assert mon.poll_once() is None and mon.records.checkpointed
    _write(mon.run.dir, {"kind": "stopped", "step": 2, "rank": 0, "ts": 0.0})
    assert mon.poll_once() is None  # pending: requeued, not an outcome
    seen = mon.records
    assert seen.stopped_at is None and not seen.sigterm_nodes and not seen.checkpointed
    assert mon.poll_once() is None  # running again
    _write(mon.run.dir, _step(3), _step(4), {"kind": "checkpoint", "step": 4, "ts": 0.0})
    outcome = mon.poll_once()
    assert outcome is not None and outcome.ok and outcome.kind == "completed"
    kinds = [e["kind"] for e in db.events("r")]
    assert kinds.count("requeue") == 1 and "stopped" in kinds
    assert backend.cancels == []


def test_a_job_waiting_before_it_ever_ran_is_queued_not_requeued(tmp_path):
    mon, _, db = _monitor(tmp_path, [REQUEUED, REQUEUED, RUNNING, DONE])
    assert mon.poll_once() is None
    assert mon.poll_once() is None
    assert mon.poll_once() is None
    _write(mon.run.dir, *(_step(n) for n in range(1, 5)))
    assert mon.poll_once().ok
    kinds = [e["kind"] for e in db.events("r")]
    assert "requeue" not in kinds
    assert db.get_run("r")["phase"] == "training"
