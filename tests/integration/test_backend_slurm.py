"""Slurm backend: state mapping, and real jobs on a private single-node Slurm cluster.

The cluster tests start munged, slurmctld and slurmd from tests/slurm_cluster.py (once
per module) and skip, with the reason, where Slurm is not installed or cannot start.
They are marked ``multiproc`` (they run real processes for seconds) and ``slurm``.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from jobctl.backends import Rendered, get_backend
from jobctl.backends.slurm import SlurmBackend, node_status, sbatch_context, wait_status
from jobctl.engine.state.db import StateDB
from jobctl.engine.worker.reference import reference_train

from .. import slurm_cluster
from ..backend_jobs import run_on, service_fixture, two_process_spec, wait_done
from ..jobrun import events
from ..render_contexts import context

WAIT_S = 60.0
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("state", "code", "sig", "phase", "exit_code", "cause"),
    [
        ("PENDING", 0, 0, "pending", None, ""),
        ("REQUEUED", 0, 0, "pending", None, ""),  # preempted, will run again
        ("RUNNING", 0, 0, "running", None, ""),
        ("COMPLETING", 0, 0, "running", None, ""),
        ("COMPLETED", 0, 0, "succeeded", 0, ""),
        ("FAILED", 3, 0, "failed", 3, ""),
        ("FAILED", 0, 9, "failed", 137, ""),  # killed by a signal on its own account
        ("OUT_OF_MEMORY", 0, 0, "failed", 1, ""),
        ("CANCELLED by 0", 0, 15, "stopped", -15, "cancelled"),
        ("CANCELLED", 0, 0, "stopped", -15, "cancelled"),
        ("PREEMPTED", 0, 0, "stopped", -15, "preempted"),
        ("NODE_FAIL", 0, 0, "stopped", -15, "preempted"),  # the node died, not the code
        ("TIMEOUT", 0, 1, "stopped", -1, "timeout"),
        ("SOMETHING_NEW", 0, 0, "failed", 1, ""),
    ],
)
def test_slurm_states_map_to_phases(state, code, sig, phase, exit_code, cause):
    status = node_status(state, code, sig)
    assert (status.phase, status.exit_code, status.cause) == (phase, exit_code, cause)


def test_pending_jobs_carry_the_reason():
    assert node_status("PENDING", reason="Resources").detail == "PENDING (Resources)"
    assert node_status("PENDING", reason="None").detail == "PENDING"


def test_squeue_exit_codes_are_wait_statuses():
    assert wait_status("0") == (0, 0)
    assert wait_status("768") == (3, 0)  # exit 3
    assert wait_status("15") == (0, 15)  # killed by SIGTERM
    assert wait_status("N/A") == (0, 0)


def test_requeue_follows_spot_unless_set():
    assert sbatch_context(context("slurm", {"spot": True}))["requeue"] is True
    assert sbatch_context(context("slurm", {}))["requeue"] is False
    explicit = context("slurm", {"spot": True, "slurm": {"requeue": False}})
    assert sbatch_context(explicit)["requeue"] is False


cluster = service_fixture(
    "cluster", slurm_cluster.start, slurm_cluster.ClusterUnavailable, "no Slurm cluster here"
)


@pytest.fixture
def slurm_env(cluster, monkeypatch):
    for name, value in cluster.env.items():
        monkeypatch.setenv(name, value)
    return cluster


def _submit_stub(tmp_path: Path, node_script: str):
    """The real batch script, with a stub in place of the torchrun node script."""
    backend = SlurmBackend(status_ttl_s=0)
    ctx = context(
        "slurm", {"nodes": 1, "memory_gb": 0.1}, run_dir=tmp_path, nnodes=1, nproc_per_node=[1]
    )
    files = backend.render(ctx).files
    stub = Rendered("slurm", {"job.sbatch": files["job.sbatch"], "node-0.sh": node_script})
    return backend, backend.submit(stub, ctx)


@pytest.mark.multiproc
@pytest.mark.slurm
@pytest.mark.parametrize(("code", "phase"), [(0, "succeeded"), (3, "failed")])
def test_batch_script_exit_codes_reach_status(slurm_env, tmp_path, code, phase):
    backend, handles = _submit_stub(tmp_path, f"echo node $SLURM_NODEID; exit {code}\n")
    (status,) = wait_done(backend, handles, WAIT_S)
    assert (status.phase, status.exit_code) == (phase, code)
    assert (tmp_path / "logs" / "node-0.log").read_text() == "node 0\n"
    assert backend.logs(handles, tmp_path)[-1].name == f"slurm-{handles[0]}.out"


@pytest.mark.multiproc
@pytest.mark.slurm
def test_scancel_is_stopped_not_failed(slurm_env, tmp_path):
    backend, handles = _submit_stub(tmp_path, "sleep 120\n")
    deadline = time.monotonic() + WAIT_S
    while backend.status(handles)[0].phase != "running":
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.5)
    backend.cancel(handles)
    (status,) = wait_done(backend, handles, WAIT_S)
    assert (status.phase, status.detail) == ("stopped", "CANCELLED")


@pytest.mark.multiproc
@pytest.mark.slurm
def test_jobctl_run_completes_on_slurm(slurm_env, tmp_path):
    spec = two_process_spec("slurm")
    run, outcome = run_on(spec, tmp_path / "home")
    assert outcome.ok, outcome.message
    row = StateDB(tmp_path / "home").get_run(run.id)
    assert (row["phase"], row["step"]) == ("completed", spec.training.steps)
    job_id = row["pids"]
    assert get_backend("slurm").status([job_id])[0].detail == "COMPLETED"
    logs = sorted(p.name for p in (run.dir / "logs").iterdir())
    assert logs == ["node-0.log", "rank-0.log", "rank-1.log", f"slurm-{job_id}.out"]


@pytest.mark.multiproc
@pytest.mark.slurm
def test_scancel_of_a_jobctl_run_leaves_it_stopped(slurm_env, tmp_path):
    home = tmp_path / "home"
    db = StateDB(home)  # tables exist before the supervisor thread opens the database
    spec = two_process_spec("slurm", steps=400)
    result = {}
    thread = threading.Thread(target=lambda: result.update(out=run_on(spec, home)))
    thread.start()
    row = _wait_for_step(db, thread)
    subprocess.run(["scancel", row["pids"]], check=True, timeout=30)
    thread.join(timeout=WAIT_S)
    assert not thread.is_alive(), "the supervisor did not notice the cancelled job"
    run, outcome = result["out"]
    assert db.get_run(run.id)["phase"] == "stopped", outcome.message


def _wait_for_step(db: StateDB, thread: threading.Thread) -> dict:
    return _wait_for(db, thread, lambda r: (r.get("step") or 0) >= 1, "its first step")


def _wait_for(db: StateDB, thread: threading.Thread, ready, what: str) -> dict:
    deadline = time.monotonic() + 2 * WAIT_S
    while time.monotonic() < deadline and thread.is_alive():
        runs = db.list_runs()
        if runs and runs[0].get("pids") and ready(runs[0]):
            return runs[0]
        time.sleep(0.5)
    raise AssertionError(f"the run never reached {what}")


@pytest.mark.multiproc
@pytest.mark.slurm
def test_time_limit_signal_checkpoints_and_stops_the_run(slurm_env, tmp_path):
    # Slurm signals within 60 s of the asked lead time: with a 1-minute limit and a 45 s
    # lead, SIGTERM comes in the first seconds of training.
    slurm = {"time_limit_minutes": 1, "signal_before_s": 45}
    spec = two_process_spec("slurm", steps=5000, **{"hardware.slurm": slurm})
    run, outcome = run_on(spec, tmp_path / "home", deadline_s=150)
    row = StateDB(tmp_path / "home").get_run(run.id)
    assert (outcome.kind, row["phase"]) == ("stopped", "stopped"), outcome.message
    # Slurm may signal while torchrun is still in rendezvous: then no step was trained
    # and the run stops with nothing to lose; otherwise it checkpointed the last step.
    if row["step"]:
        assert 0 < row["last_checkpoint"] == row["step"] < spec.training.steps
        assert (run.dir / "checkpoints" / f"step-{row['step']:08d}").is_dir()
    else:
        assert "before the first step" in outcome.message


@pytest.mark.multiproc
@pytest.mark.slurm
def test_requeue_resumes_from_the_newest_checkpoint(slurm_env, tmp_path, monkeypatch):
    home = tmp_path / "home"
    db = StateDB(home)
    # Rank 0 sleeps 20 ms per forward (8 per step), so the requeue surely lands mid-run:
    # the plain quickstart trains its 24 steps in under a second, sometimes before
    # `scontrol requeue` gets there. The reference (no RANK) runs the same model unslowed.
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # sbatch exports it: workers find tests/
    spec = two_process_spec(
        "slurm",
        steps=24,
        **{
            "checkpoint.interval": 4,
            "training.optimizer": "sgd",
            "training.lr": 0.3,
            "hardware.slurm": {"requeue": True},
            "model.import": "tests.slowmodel:factory",
            "model.import_args": {"slow_rank": 0, "delay_s": 0.02},
            "model.family": None,
        },
    )
    result = {}
    thread = threading.Thread(target=lambda: result.update(out=run_on(spec, home, 300)))
    thread.start()
    row = _wait_for(db, thread, lambda r: (r.get("last_checkpoint") or 0) >= 4, "a checkpoint")
    subprocess.run(["scontrol", "requeue", row["pids"]], check=True, timeout=30)
    thread.join(timeout=300)
    assert not thread.is_alive(), "the supervisor did not follow the requeued job"
    run, outcome = result["out"]
    assert outcome.ok, outcome.message
    row = db.get_run(run.id)
    assert (row["phase"], row["step"]) == ("completed", spec.training.steps)
    evs = [(e["kind"], e["message"]) for e in db.events(run.id)]
    assert "requeue" in [k for k, _ in evs], "\n".join(map(str, evs))
    recs = events(run.dir)
    steps = [e for e in recs if e["kind"] == "step"]
    ref, _ = reference_train(spec)
    assert sorted({e["step"] for e in steps}) == list(range(1, spec.training.steps + 1))
    for e in steps:  # every step's loss is the uninterrupted one: same data, same state
        assert e["loss"] == pytest.approx(ref[e["step"] - 1], abs=1e-5), e
    # The requeue's SIGTERM checkpointed a step; the requeued job went on right after it.
    stop = next(i for i, e in enumerate(recs) if e["kind"] == "stopped")
    after = next(e for e in recs[stop:] if e["kind"] == "step")
    assert after["step"] == recs[stop]["step"] + 1 > 1


@pytest.mark.multiproc
@pytest.mark.slurm
def test_a_queued_run_shows_launching_with_the_reason(slurm_env, tmp_path):
    # A job holding every CPU of the one node keeps the run waiting for Resources.
    out = subprocess.run(
        ["sbatch", "--parsable", "--exclusive", "--output=/dev/null", "--wrap=sleep 120"],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    blocker = out.stdout.strip().split(";")[0]
    home = tmp_path / "home"
    db = StateDB(home)
    spec = two_process_spec("slurm")
    result = {}
    thread = threading.Thread(target=lambda: result.update(out=run_on(spec, home, 240)))
    thread.start()
    try:
        row = _wait_for(db, thread, lambda r: r["phase"] == "launching" and r["message"], "queue")
        assert row["message"].startswith("queued: PENDING ("), row["message"]
    finally:
        subprocess.run(["scancel", blocker], check=True, timeout=30)
    thread.join(timeout=240)
    run, outcome = result["out"]
    assert outcome.ok, outcome.message
    phases = [e["message"] for e in db.events(run.id) if e["kind"] == "phase"]
    assert any(m.startswith("launching: queued: PENDING") for m in phases), phases
    assert db.get_run(run.id)["phase"] == "completed"
