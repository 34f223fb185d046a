"""One supervisor per run: a resume adopts live nodes and records itself as their
supervisor (state DB and host.json), and nobody resumes a run another live process
supervises. The "nodes" and the run host here are plain sleeping processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from jobctl.engine.channel.host import HOST_FILE, read_host
from jobctl.engine.core.process import pid_alive, process_token
from jobctl.engine.supervise.adoption import AdoptError
from jobctl.engine.supervise.attempt import claim_host
from jobctl.engine.supervise.launch import free_port, register_run

from ..jobrun import ROOT, wait_for
from ..supervisor_doubles import elastic_spec, supervisor

JOBCTL = [sys.executable, "-m", "jobctl.engine.cli.app"]


@pytest.fixture
def sleepers():
    procs: list[subprocess.Popen] = []

    def start(n: int) -> list[int]:
        new = [subprocess.Popen(["sleep", "120"]) for _ in range(n)]
        procs.extend(new)
        return [p.pid for p in new]

    yield start
    for p in procs:
        p.kill()
        p.wait()


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _orphaned_run(tmp_path, sleepers, gone: int | None = None, token: str | None = None):
    """A run in training whose supervisor (``gone``, started at ``token``) is gone while
    its nodes and run host live."""
    spec = elastic_spec()
    sup, launcher, db, clock = supervisor(tmp_path, spec)
    run_id = "orphan-1"
    run_dir = register_run(spec, db, None, run_id, backend="local")
    (run_dir / "plan.json").write_text(sup.plan.model_dump_json())
    gone = gone or _dead_pid()
    db.update_run(
        run_id,
        supervisor_pid=gone,
        supervisor_token=token,
        pids=",".join(map(str, sleepers(2))),
        step=3,
    )
    for phase in ("calibrating", "planning", "launching", "training"):
        db.set_phase(run_id, phase)
    host = {"pid": sleepers(1)[0], "rdzv_endpoint": "127.0.0.1:29999", "channel_url": ""}
    (run_dir / HOST_FILE).write_text(
        json.dumps({**host, "supervisor": gone, "supervisor_token": token})
    )
    return spec, db, run_id, run_dir


def test_resume_adopts_and_records_itself_as_the_supervisor(tmp_path, sleepers):
    spec, db, run_id, run_dir = _orphaned_run(tmp_path, sleepers)
    sup, launcher, _, _ = supervisor(tmp_path, spec, run_id=run_id)
    assert sup.step() == "training"  # adopted: nothing launched
    assert launcher.attempts == [] and sup.monitor is not None
    assert read_host(run_dir).supervisor == os.getpid()
    assert db.get_run(run_id)["supervisor_pid"] == os.getpid()
    assert [e["kind"] for e in db.events(run_id)][-1] == "adopt"
    # A second `jobctl resume` (another process) must not supervise it too.
    env = {**os.environ, "JOBCTL_HOME": str(db.home), "COLUMNS": "200"}
    r = subprocess.run(
        [*JOBCTL, "resume", run_id], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"still supervised by pid {os.getpid()}" in r.stderr
    assert db.get_run(run_id)["supervisor_pid"] == os.getpid()  # unchanged


def test_a_reused_supervisor_pid_does_not_hold_the_run(tmp_path, sleepers):
    """The dead supervisor's pid now names another process (it started later): the run
    is adopted all the same, and the new supervisor is recorded with its start time."""
    reused = sleepers(1)[0]
    spec, db, run_id, run_dir = _orphaned_run(tmp_path, sleepers, reused, token="1")
    assert process_token(reused) not in (None, "1")  # the live process is another one
    sup, launcher, _, _ = supervisor(tmp_path, spec, run_id=run_id)
    assert sup.step() == "training" and launcher.attempts == []  # adopted
    row, host = db.get_run(run_id), read_host(run_dir)
    me = (os.getpid(), process_token(os.getpid()))
    assert (row["supervisor_pid"], row["supervisor_token"]) == me
    assert (host.supervisor, host.supervisor_token) == me and host.supervised()


def test_resume_refuses_a_run_whose_supervisor_lives(tmp_path, sleepers):
    spec = elastic_spec()
    sup, launcher, db, clock = supervisor(tmp_path, spec)
    register_run(spec, db, None, "busy-1", backend="local")
    other = sleepers(1)[0]
    db.update_run("busy-1", supervisor_pid=other)
    db.set_phase("busy-1", "stopped")
    second, launcher, _, _ = supervisor(tmp_path, spec, run_id="busy-1")
    with pytest.raises(AdoptError, match=f"still supervised by pid {other}"):
        second.step()
    assert db.get_run("busy-1")["supervisor_pid"] == other and launcher.attempts == []


def test_resume_claims_a_run_whose_supervisor_died(tmp_path):
    spec = elastic_spec()
    sup, launcher, db, clock = supervisor(tmp_path, spec)
    register_run(spec, db, None, "idle-1", backend="local")
    db.update_run("idle-1", supervisor_pid=_dead_pid(), stop_requested=5.0)
    db.set_phase("idle-1", "stopped")
    second, launcher, _, _ = supervisor(tmp_path, spec, run_id="idle-1")
    assert second.step() == "stopped"  # attached
    row = db.get_run("idle-1")
    assert row["supervisor_pid"] == os.getpid() and row["stop_requested"] is None
    assert [second.step() for _ in range(4)] == ["calibrating", "planning", "launching", "training"]


def test_a_dead_supervisors_attempt_without_live_nodes_is_relaunched(tmp_path):
    spec = elastic_spec()
    sup, launcher, db, clock = supervisor(tmp_path, spec)
    run_dir = register_run(spec, db, None, "gone-1", backend="local")
    (run_dir / "plan.json").write_text(sup.plan.model_dump_json())
    for phase in ("calibrating", "planning", "launching", "training", "checkpointing"):
        db.set_phase("gone-1", phase)
    second, launcher, _, _ = supervisor(tmp_path, spec, run_id="gone-1")
    assert second.step() == "morphing"
    assert [second.step() for _ in range(3)] == ["planning", "launching", "training"]
    assert (run_dir / "attempts" / "0" / "plan.json").exists()  # the old layout is kept


def test_the_run_host_lives_while_a_supervisor_does_and_follows_an_adoption(tmp_path):
    """The run host (rendezvous store, event channel) ends once no supervisor runs and
    no event came for its idle time; it asks host.json who supervises, so a `jobctl
    resume` that adopted the run keeps it, and a reused pid does not."""
    run_dir = tmp_path / "run"
    starter = (
        "import sys; from pathlib import Path; "
        "from jobctl.engine.channel.host import spawn_run_host, wait_run_host; "
        "d = Path(sys.argv[1]); p = spawn_run_host(d, sys.argv[2], idle_exit_s=1.0); "
        "print(wait_run_host(d, p).pid)"
    )
    endpoint = f"127.0.0.1:{free_port()}"
    out = subprocess.run(
        [sys.executable, "-c", starter, str(run_dir), endpoint],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    host_pid = int(out.stdout.split()[-1])  # its supervisor, the starter, has ended
    try:
        claim_host(run_dir)  # this process adopts the run
        time.sleep(3.0)
        assert pid_alive(host_pid), "the run host ended while its adopter ran"
        info = json.loads((run_dir / HOST_FILE).read_text())
        info["supervisor_token"] = "1"  # the adopter's pid, now another process's
        (run_dir / HOST_FILE).write_text(json.dumps(info))
        wait_for(lambda: not pid_alive(host_pid), 15, "the run host's end")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(host_pid, signal.SIGKILL)
