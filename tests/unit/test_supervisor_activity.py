"""Worker records drive the active phases (checkpointing, uploading, rebalancing, next
to pruning), and a failed node is told apart: a bug, or a process that was killed."""

from __future__ import annotations

import pytest

from jobctl.engine.pruning.events import PruningWatch
from jobctl.engine.supervise.activity import ActivityWatch
from jobctl.engine.supervise.crash import (
    bug_ranks,
    exception_line,
    is_comm_error,
    lost_process_nodes,
)

from ..supervisor_doubles import training_db

PRUNED = {"target_sparsity": 0.5, "achieved_sparsity": 0.5, "stage_sparsity": [0.5, 0.5]}


@pytest.fixture
def db(tmp_path):
    return training_db(tmp_path)


def _feed(db, watches, *recs) -> str:
    """Records through the watches in the monitor's order; the run's phase after."""
    for rec in recs:
        for w in watches:
            if isinstance(w, PruningWatch):
                if rec["kind"] == "step":
                    w.step(rec["step"])
                elif rec["kind"] in ("pruning", "profile"):
                    w.record(rec)
            else:
                w.record(rec)
    return db.get_run("r")["phase"]


def _step(n):
    return {"kind": "step", "step": n}


def test_checkpoint_phase_spans_due_step_to_published(db):
    a = ActivityWatch(db, "r", interval=3, total=9, remote=False)
    assert _feed(db, [a], _step(1), _step(2)) == "training"
    assert _feed(db, [a], _step(3)) == "checkpointing"
    assert _feed(db, [a], _step(4)) == "checkpointing"  # written in the background
    assert _feed(db, [a], {"kind": "checkpoint", "step": 3}) == "training"
    # A snapshot replaced by a newer one: the newer checkpoint ends the phase.
    assert _feed(db, [a], _step(6), {"kind": "checkpoint_skipped", "step": 6}) == "checkpointing"
    assert _feed(db, [a], _step(7), {"kind": "checkpoint", "step": 7}) == "training"


def test_background_uploads_are_a_field_the_final_one_a_phase(db):
    a = ActivityWatch(db, "r", interval=3, total=6, remote=True)
    _feed(db, [a], _step(3), {"kind": "checkpoint", "step": 3})
    assert _feed(db, [a], {"kind": "upload", "step": 3, "bytes_done": 1}) == "training"
    assert db.get_run("r")["uploading_step"] == 3
    assert _feed(db, [a], {"kind": "uploaded", "step": 3}) == "training"
    assert db.get_run("r")["uploading_step"] is None
    assert _feed(db, [a], _step(6), {"kind": "checkpoint", "step": 6}) == "uploading"
    assert _feed(db, [a], {"kind": "uploaded", "step": 6}) == "uploading"  # completes next
    db.set_phase("r", "completed")


def test_sigterm_means_checkpoint_now(db):
    a = ActivityWatch(db, "r", interval=100, total=200, remote=False)
    _feed(db, [a], _step(5))
    assert _feed(db, [a], {"kind": "sigterm", "node": 1, "rank": 2}) == "checkpointing"
    assert _feed(db, [a], {"kind": "checkpoint", "step": 6}) == "training"
    msgs = [e["message"] for e in db.events("r") if e["kind"] == "phase"]
    assert msgs[-2] == "checkpointing: node 1 told to stop: checkpoint at the end of the step"


def test_layer_moves_are_rebalancing_until_the_new_layout_trained_a_step(db):
    a = ActivityWatch(db, "r", interval=100, total=200, remote=False)
    _feed(db, [a], _step(3))
    assert _feed(db, [a], {"kind": "rebalanced", "step": 3, "moved_at": 3}) == "rebalancing"
    assert _feed(db, [a], {"kind": "rebalance", "step": 3}) == "rebalancing"
    assert _feed(db, [a], _step(4)) == "training"
    # Records of different ranks arrive in any order: a move whose next step is already
    # in is over.
    assert _feed(db, [a], _step(6), {"kind": "packed", "step": 5, "moved_at": 5}) == "training"


def test_pruning_keeps_its_phase_then_layers_move(db):
    a = ActivityWatch(db, "r", interval=2, total=20, remote=False)
    p = PruningWatch(db, "r")
    watches = [p, a]
    assert _feed(db, watches, _step(2), {"kind": "pruning", "step": 2, **PRUNED}) == "pruning"
    assert _feed(db, watches, {"kind": "checkpoint", "step": 2}) == "pruning"
    assert _feed(db, watches, _step(3)) == "training"  # the profiled step
    assert _feed(db, watches, _step(4), {"kind": "pruning", "step": 4, **PRUNED}) == "pruning"
    assert _feed(db, watches, {"kind": "packed", "step": 4, "moved_at": 4}) == "rebalancing"
    assert _feed(db, watches, {"kind": "checkpoint", "step": 4}) == "rebalancing"
    assert _feed(db, watches, _step(5)) == "training"
    phases = [e["message"].split(":")[0] for e in db.events("r") if e["kind"] == "phase"]
    assert phases[5:] == [
        "checkpointing",
        "pruning",
        "training",
        "checkpointing",
        "pruning",
        "rebalancing",
        "training",
    ]


def test_morphing_is_never_undone_by_late_records(db):
    a = ActivityWatch(db, "r", interval=3, total=9, remote=False)
    _feed(db, [a], _step(3))
    db.set_phase("r", "morphing")
    assert _feed(db, [a], {"kind": "checkpoint", "step": 3}, _step(4)) == "morphing"


GLOO = (
    "Traceback (most recent call last):\n  File x\n    work.wait()\n"
    "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
    "Connection closed by peer [127.0.0.1]:6544. This is typically caused by a remote "
    "worker crashing.\n"
)
SHM = (
    "Traceback (most recent call last):\n  File x\n    raise PeerGone(...)\n"
    "jobctl.engine.runtime.p2p.shm.PeerGone: the peer closed its end of a message\n"
)
BUG = "Traceback (most recent call last):\n  File x\n    raise\nRuntimeError: boom\n"


def test_error_reports_tell_a_bug_from_a_peer_gone(tmp_path):
    assert exception_line(BUG) == "RuntimeError: boom"
    assert is_comm_error(GLOO) and not is_comm_error(BUG)
    assert is_comm_error("torch.distributed.DistBackendError: NCCL error in: x\n")
    # A shared-memory neighbour (on the local backend, on any "node") that died.
    assert is_comm_error(SHM)
    assert (
        exception_line(SHM)
        == "jobctl.engine.runtime.p2p.shm.PeerGone: the peer closed its end of a message"
    )
    errors = tmp_path / "errors"
    errors.mkdir()
    (errors / "rank-0.txt").write_text(GLOO)
    (errors / "rank-1.txt").write_text(SHM)
    assert bug_ranks(tmp_path) == []
    nodes = {0: 0, 1: 0, 2: 1, 3: 1}
    started = {0, 1, 2, 3}
    assert lost_process_nodes(tmp_path, nodes, {0}, started) == []  # node 0's ranks reported
    assert lost_process_nodes(tmp_path, nodes, {0, 1}, started) == [1]
    assert lost_process_nodes(tmp_path, nodes, {0, 1}, {0, 1}) == []  # node 1 never trained
    (errors / "rank-3.txt").write_text(BUG)
    assert bug_ranks(tmp_path) == [3]


def test_each_steps_upload_is_recorded_once_however_many_ranks_report_it(db, tmp_path):
    """Every rank sharing the disk reports the commit it saw: one event per step, in
    the order the commits came (a late older step is still news), and the newest."""
    from jobctl.engine.channel.liveness import HeartbeatWatch
    from jobctl.engine.supervise.records import AttemptRecords
    from jobctl.engine.supervise.scaling import ScaleWatch

    watches = (HeartbeatWatch(None, lambda: 0.0), ScaleWatch(tmp_path, db.clock))
    records = AttemptRecords(db, "r", 30, watches, 0.15, lambda: 0.0)
    for step in (20, 20, 10, 20, 10, 30, 30):
        assert records.record({"kind": "uploaded", "step": step, "rank": 0})
    said = [e["message"] for e in db.events("r") if e["kind"] == "upload"]
    assert said == [f"checkpoint step {s} uploaded" for s in (20, 10, 30)]
    assert db.get_run("r")["last_upload"] == 30


def test_step_records_do_not_read_the_run_each(db, monkeypatch):
    # #55: the run's row is read when the wanted phase changes, not per step record;
    # a managed phase set elsewhere meanwhile is put right once RECHECK_S has passed.
    import jobctl.engine.supervise.activity as activity

    a = ActivityWatch(db, "r", interval=1000, total=2000, remote=False)
    reads = []
    real = db.get_run
    monkeypatch.setattr(db, "get_run", lambda run_id: reads.append(run_id) or real(run_id))
    for n in range(1, 51):
        a.record(_step(n))
    assert len(reads) == 1
    db.set_phase("r", "checkpointing")  # a managed phase, not this watch's doing
    monkeypatch.setattr(activity, "RECHECK_S", 0.0)
    a.record(_step(51))
    assert real("r")["phase"] == "training" and len(reads) == 2
