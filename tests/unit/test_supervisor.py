"""The supervisor's state machine, stepped by hand on fake time with a fake launcher.

Each ``step()`` is one transition (or one poll of the running attempt); worker records
are written to metrics.jsonl by the test, node states are set on the fake backend.
"""

from __future__ import annotations

import json
import signal
import time

import pytest
from typer.testing import CliRunner

from jobctl.backends.base import NodeStatus
from jobctl.engine.cli.app import app

from ..supervisor_doubles import (
    KILLED,
    RUNNING,
    SUCCEEDED,
    FakeLauncher,
    heartbeat,
    phases,
    step,
    supervisor,
    to_training,
    write,
)


def _train(sup, launcher, clock, steps, ts0: float = 1000.0) -> None:
    """Steps ``steps`` (heartbeats from every rank, then the step) and one poll each."""
    for n in steps:
        ts = ts0 + n
        plan = sup.plan
        write(sup.current.dir, *(heartbeat(n, r.rank, r.node, ts) for r in plan.ranks))
        write(sup.current.dir, step(n, ts))
        sup.step()


def test_a_run_walks_through_every_phase_one_step_at_a_time(tmp_path):
    sup, launcher, db, clock = supervisor(tmp_path)
    assert to_training(sup) == ["pending", "calibrating", "planning", "launching", "training"]
    run_id = sup.run_id
    assert db.get_run(run_id)["pids"] == "a0n0,a0n1" and launcher.ready_calls == 1
    kinds = [e["kind"] for e in db.events(run_id)]
    assert kinds.index("calibration") < kinds.index("plan")  # the steps did their work
    _train(sup, launcher, clock, [1, 2])
    assert sup.step() == "training"
    _train(sup, launcher, clock, [3])  # a checkpoint is due at step 3
    assert sup.phase == "checkpointing"
    _train(sup, launcher, clock, [4])  # training goes on while it is written
    assert sup.phase == "checkpointing"
    write(sup.current.dir, {"kind": "checkpoint", "step": 3, "ts": 1004.5})
    assert sup.step() == "training"
    _train(sup, launcher, clock, [5, 6])
    write(sup.current.dir, {"kind": "checkpoint", "step": 6, "ts": 1007.0})
    assert sup.step() == "training"
    launcher.nodes.set_all(SUCCEEDED)
    assert sup.step() == "completed" and sup.done
    assert sup.step() == "completed"  # a finished supervisor does nothing more
    row = db.get_run(run_id)
    assert (row["step"], row["last_checkpoint"], row["supervisor_pid"]) == (6, 6, None)
    assert phases(db, run_id) == [
        "pending",
        "calibrating",
        "planning",
        "launching",
        "training",
        "checkpointing",
        "training",
        "checkpointing",
        "training",
        "completed",
    ]
    assert all(ts >= 1000.0 for ts in (e["ts"] for e in db.events(run_id)))  # injected clock


def test_launch_runs_the_same_machine_to_the_end(tmp_path):
    sup, launcher, db, clock = supervisor(tmp_path)
    sleeps = []

    def sleep(dt):  # the workers finish while the supervisor sleeps
        sleeps.append(dt)
        if len(sleeps) == 3:
            write(sup.current.dir, step(6, 1001.0), {"kind": "checkpoint", "step": 6, "ts": 1})
            launcher.nodes.set_all(SUCCEEDED)

    sup.sleep = sleep
    run, outcome = sup.run_to_end(interval=0.5)
    assert outcome.ok and run.id == sup.run_id and sleeps == [0.5] * 3
    assert db.get_run(run.id)["phase"] == "completed"


def test_lost_node_morphs_and_recovery_counts_from_its_last_heartbeat(tmp_path):
    sup, launcher, db, clock = supervisor(tmp_path)
    to_training(sup)
    _train(sup, launcher, clock, [1, 2])  # node 1's last word: step 2's heartbeat at 1002
    write(sup.current.dir, heartbeat(3, 0, 0, 1003.0))  # node 0 goes on a little
    launcher.nodes.state["a0n1"] = KILLED
    assert sup.step() == "morphing"
    assert sup.outcome.kind == "preempted" and sup.outcome.lost_nodes == [1]
    assert launcher.attempts[0].backend.cancels[-1] == (["a0n0", "a0n1"], signal.SIGKILL)
    assert sup.step() == "planning" and sup.plan.world_size == 2  # same global batch
    assert sup.step() == "launching" and db.get_run(sup.run_id)["pids"] == "a1n0"
    assert sup.step() == "training"
    write(sup.current.dir, step(1, 1009.5))  # the first step of the new layout
    assert sup.step() == "training"
    row = db.get_run(sup.run_id)
    assert row["recovery_s"] == 7.5  # 1009.5 - 1002.0: from the loss, not its detection
    rec = next(e for e in db.events(sup.run_id) if e["kind"] == "recovery")
    data = json.loads(rec["data"])
    assert (data["lost_at"], data["nodes"], data["sign"]) == (1002.0, [1], "last heartbeat")
    assert row["devices"] == 2 and row["plan"].startswith("P=")
    assert "morphing" in phases(db, sup.run_id)


def test_sigterm_node_recovery_counts_from_its_notice(tmp_path):
    sup, launcher, db, clock = supervisor(tmp_path)
    to_training(sup)
    _train(sup, launcher, clock, [1])
    run_dir = sup.current.dir
    write(run_dir, {"kind": "node_sigterm", "node": 0, "ts": 1001.25})
    write(run_dir, *({"kind": "sigterm", "rank": r, "node": 0, "ts": 1001.5} for r in (0, 1)))
    assert sup.step() == "checkpointing"  # checkpoint now, then exit
    write(run_dir, heartbeat(2, 0, 0, 1002.0), step(2, 1002.0))
    write(run_dir, {"kind": "checkpoint", "step": 2, "ts": 1002.2})
    write(run_dir, {"kind": "stopped", "step": 2, "rank": 0, "ts": 1002.3})
    launcher.nodes.set_all(NodeStatus("stopped", -15, "exit -15", "preempted"))
    assert sup.step() == "morphing"
    assert sup.outcome.lost_nodes == [0]
    notice = next(e for e in db.events(sup.run_id) if e["kind"] == "sigterm")
    assert json.loads(notice["data"]) == {"node": 0, "ts": 1001.25}
    for want in ("planning", "launching", "training"):
        assert sup.step() == want
    write(sup.current.dir, step(3, 1010.25))
    sup.step()
    assert db.get_run(sup.run_id)["recovery_s"] == 9.0  # from the notice


def test_deadline_uses_the_injected_clock(tmp_path):
    sup, launcher, db, clock = supervisor(tmp_path, deadline_s=30)
    to_training(sup)
    clock.sleep(29)
    assert sup.step() == "training"
    clock.sleep(2)
    assert sup.step() == "failed"
    assert sup.outcome.exit_code == 124 and "timed out after 30 s" in sup.outcome.message
    assert launcher.nodes.cancels[-1][1] == signal.SIGKILL


def test_stop_during_a_morph_stops_between_attempts(tmp_path):
    sup, launcher, db, clock = supervisor(tmp_path)
    to_training(sup)
    launcher.nodes.state["a0n1"] = KILLED
    assert sup.step() == "morphing"
    r = CliRunner().invoke(app, ["stop", sup.run_id, "--home", str(db.home), "--no-wait"])
    assert r.exit_code == 0 and "checkpoint and stop" in r.output, r.output
    assert "supervisor" in r.output  # a request for the supervisor, no stale pid signalled
    assert sup.step() == "stopped" and sup.outcome.kind == "stopped"
    assert len(launcher.attempts) == 1  # nothing relaunched
    assert db.get_run(sup.run_id)["supervisor_pid"] is None


def test_stop_after_a_morph_signals_the_new_nodes(tmp_path):
    sup, launcher, db, clock = supervisor(tmp_path)
    to_training(sup)
    launcher.nodes.state["a0n1"] = KILLED
    for want in ("morphing", "planning", "launching", "training"):
        assert sup.step() == want
    old, new = (a.backend for a in launcher.attempts)
    cancels_before = list(old.cancels)
    r = CliRunner().invoke(app, ["stop", sup.run_id, "--home", str(db.home), "--no-wait"])
    assert r.exit_code == 0, r.output
    assert db.get_run(sup.run_id)["phase"] == "stopping"  # from the request on
    assert sup.step() == "stopping"
    assert new.cancels == [(["a1n0"], signal.SIGTERM)]
    assert old.cancels == cancels_before  # the dead attempt's handles are left alone
    assert sup.step() == "stopping"  # applied once
    assert new.cancels == [(["a1n0"], signal.SIGTERM)]
    kinds = [e["kind"] for e in db.events(sup.run_id)]
    assert kinds.count("stop") == 1 and kinds.count("stop_signal") == 1  # #47: listed twice
    r = CliRunner().invoke(app, ["status", "--home", str(db.home)], env={"COLUMNS": "80"})
    assert r.exit_code == 0 and "stopping" in r.output, r.output
    run_dir = sup.current.dir
    write(run_dir, {"kind": "sigterm", "rank": 0, "node": 0, "ts": 1003.0})
    write(run_dir, heartbeat(2, 0, 0, 1003.05), step(2, 1003.06))  # the step it finishes
    write(run_dir, {"kind": "checkpoint", "step": 2, "ts": 1003.1})
    assert sup.step() == "stopping"  # the workers' records do not move it back
    write(run_dir, {"kind": "stopped", "step": 2, "rank": 0, "ts": 1003.2})
    new.set_all(NodeStatus("stopped", -15, "exit -15", "cancelled"))
    assert sup.step() == "stopped"
    phases_seen = [
        e["message"].split(":")[0] for e in db.events(sup.run_id) if e["kind"] == "phase"
    ]
    assert phases_seen[-2:] == ["stopping", "stopped"]


def test_a_stop_asked_through_the_db_alone_shows_stopping(tmp_path):
    """Ctrl-C on apply records the request without `jobctl stop`'s phase change: the
    supervisor moves the run to stopping when it signals the nodes."""
    sup, launcher, db, clock = supervisor(tmp_path)
    to_training(sup)
    db.request_stop(sup.run_id, "Ctrl-C on jobctl apply")
    assert sup.step() == "stopping"
    assert launcher.nodes.cancels[-1][1] == signal.SIGTERM
    launcher.nodes.set_all(NodeStatus("stopped", -15, "exit -15", "cancelled"))
    assert sup.step() == "stopped"


def test_a_stopping_run_is_billed_until_it_has_stopped():
    from jobctl.engine.supervise.figures import device_seconds

    marks = ((0.0, "training"), (10.0, "stopping: asked"), (15.0, "stopped"))
    evs = [{"kind": "phase", "ts": t, "message": m, "data": None} for t, m in marks]
    assert device_seconds(evs, 2, now=100.0) == 30.0  # 2 devices for 10 + 5 s


def test_stop_without_a_supervisor_signals_the_recorded_nodes(tmp_path):
    sup, launcher, db, clock = supervisor(tmp_path)
    to_training(sup)
    db.release_supervisor(sup.run_id, sup_pid := db.get_run(sup.run_id)["supervisor_pid"])
    assert sup_pid is not None
    db.update_run(sup.run_id, pids="999999991")  # a pid that does not exist
    r = CliRunner().invoke(app, ["stop", sup.run_id, "--home", str(db.home), "--no-wait"])
    assert r.exit_code == 0 and "asked 1 node(s)" in r.output, r.output
    assert db.get_run(sup.run_id)["stop_requested"] is None
    assert db.get_run(sup.run_id)["phase"] == "stopping"


def _trained_with_errors_dir(tmp_path, steps):
    """A supervisor trained through ``steps``, and its attempt's new ``errors`` folder,
    where the ranks write the exception that ended them."""
    sup, launcher, db, clock = supervisor(tmp_path)
    to_training(sup)
    _train(sup, launcher, clock, steps)
    errors = sup.current.dir / "errors"
    errors.mkdir()
    return sup, launcher, db, clock, errors


def test_a_worker_process_killed_drops_its_node(tmp_path):
    sup, launcher, db, clock, errors = _trained_with_errors_dir(tmp_path, [1, 2])
    comm = "RuntimeError: [../gloo/transport/tcp/pair.cc:537] Connection reset by peer"
    dead = next(r.rank for r in sup.plan.ranks if r.node == 1)
    for r in sup.plan.ranks:
        if r.rank != dead:  # the killed rank wrote nothing; its peers lost it
            (errors / f"rank-{r.rank}.txt").write_text(f"Traceback:\n  x\n{comm}\n")
    launcher.nodes.state["a0n0"] = NodeStatus("failed", 1, "exit 1")
    assert sup.step() == "training"  # node 1 may show it was the one: a short grace
    launcher.nodes.state["a0n1"] = NodeStatus("failed", 1, "exit 1")
    assert sup.step() == "morphing"
    assert sup.outcome.kind == "preempted" and sup.outcome.lost_nodes == [1]
    assert any(e["kind"] == "process_lost" for e in db.events(sup.run_id))


def test_a_bug_fails_the_run_even_with_a_silent_rank(tmp_path):
    sup, launcher, db, clock, errors = _trained_with_errors_dir(tmp_path, [1])
    (errors / "rank-1.txt").write_text("Traceback:\n  x\nRuntimeError: boom\n")
    launcher.nodes.set_all(NodeStatus("failed", 1, "exit 1"))
    assert sup.step() == "failed"
    assert "rank 1 failed" in sup.outcome.message


def test_failed_peers_without_a_silent_rank_fail_after_the_grace(tmp_path):
    sup, launcher, db, clock, errors = _trained_with_errors_dir(tmp_path, [1])
    for r in (0, 1):
        (errors / f"rank-{r}.txt").write_text("RuntimeError: Connection closed by peer\n")
    launcher.nodes.state["a0n0"] = NodeStatus("failed", 1, "exit 1")
    assert sup.step() == "training"
    clock.sleep(11)
    launcher.nodes.state["a0n1"] = RUNNING
    assert sup.step() == "failed"  # nobody lost a process: not a preemption


def test_stop_waits_until_the_run_has_stopped_and_says_where(tmp_path):
    """#47: `jobctl stop` returned at once, so the README's next line (`jobctl resume`)
    found the run still supervised; it now waits until the supervisor has ended it."""
    import threading

    sup, launcher, db, clock = supervisor(tmp_path)
    to_training(sup)
    db.update_run(sup.run_id, step=7, last_checkpoint=5)

    def supervise():  # the supervisor's loop, in the background as a real one runs
        while db.get_run(sup.run_id)["stop_requested"] is None:
            time.sleep(0.1)
        assert sup.step() == "stopping"  # it signals the nodes; they checkpoint and end
        write(sup.current.dir, {"kind": "stopped", "step": 7, "rank": 0, "ts": 1003.2})
        launcher.attempts[-1].backend.set_all(NodeStatus("stopped", -15, "exit -15", "cancelled"))
        time.sleep(1.0)  # stop is waiting by now
        assert sup.step() == "stopped"

    t = threading.Thread(target=supervise)
    t.start()
    r = CliRunner().invoke(app, ["stop", sup.run_id, "--home", str(db.home), "--timeout", "60"])
    t.join(60)
    assert r.exit_code == 0, r.output
    assert db.get_run(sup.run_id)["phase"] == "stopped"
    assert f"run {sup.run_id} stopped at step 7 (its newest checkpoint is step 5)" in r.output


def test_the_checkpoints_snapshot_rate_is_recorded_for_the_planner(tmp_path):
    """#55: each checkpoint says how long its host copy blocked and how many bytes it
    copied; the supervisor keeps the attempt's median rate for this machine, and the
    cost forecast prices a checkpoint's blocking with it instead of an assumed rate."""
    from jobctl.engine.calibration.startup import startup_for
    from jobctl.engine.planner.cost import SNAPSHOT_GBYTES_S, Measured, cost_config
    from jobctl.engine.planner.resolver import machine_key

    sup, launcher, db, clock = supervisor(tmp_path)
    to_training(sup)
    _train(sup, launcher, clock, [1, 2, 3])
    copied = {"snapshot_bytes": 4_000_000, "kind": "checkpoint"}
    write(sup.current.dir, {**copied, "step": 3, "ts": 1004.0, "snapshot_s": 0.001})
    _train(sup, launcher, clock, [4, 5, 6])
    write(sup.current.dir, {**copied, "step": 6, "ts": 1007.0, "snapshot_s": 0.002})
    launcher.nodes.set_all(SUCCEEDED)
    assert sup.step() == "completed"
    rate = startup_for(db.home, machine_key(sup.spec), "snapshot")
    assert rate == 3.0  # GB/s: the median of 4 and 2
    assert rate != SNAPSHOT_GBYTES_S
    cfg = cost_config(sup.spec, 6e9, Measured(snapshot_gbytes_s=rate))
    assert cfg.snapshot_s == 2.0 and cost_config(sup.spec, 6e9, Measured()).snapshot_s == 3.0


def test_plan_prices_a_checkpoint_at_the_recorded_snapshot_rate(tmp_path):
    from jobctl.engine.calibration.startup import record_startup
    from jobctl.engine.planner.cost import SNAPSHOT_GBYTES_S
    from jobctl.engine.planner.resolver import machine_key, make_plan
    from jobctl.spec import load_spec

    from ..jobrun import ROOT

    spec = load_spec(ROOT / "jobs" / "quickstart.yaml")
    before = make_plan(spec, home=tmp_path).prediction
    record_startup(tmp_path, machine_key(spec), SNAPSHOT_GBYTES_S / 10, kind="snapshot")
    after = make_plan(spec, home=tmp_path).prediction
    # snapshots ten times slower than assumed: the job takes longer to finish
    assert after.finish_s > before.finish_s
    assert after.step_time_s == before.step_time_s


class _PortRaceLauncher(FakeLauncher):
    """The first run host loses its port to another run starting at the same time."""

    def __init__(self, fails: int = 1):
        super().__init__()
        self.fails = fails

    def ready(self, attempt) -> None:
        super().ready(attempt)
        if self.ready_calls <= self.fails:
            raise RuntimeError("run host exited 1:\nOSError: [Errno 98] Address already in use")


def test_a_run_host_that_lost_its_port_launches_again_on_new_ports(tmp_path):
    sup, _, db, clock = supervisor(tmp_path)
    sup.launcher = launcher = _PortRaceLauncher()
    assert (to_training(sup) + [sup.step()])[-2:] == ["launching", "training"]
    assert launcher.ready_calls == 2 and len(launcher.attempts) == 2
    kinds = [e["kind"] for e in db.events(sup.run_id)]
    assert kinds.count("port_taken") == 1 and kinds.count("plan") == 1


def test_a_run_host_that_keeps_losing_its_port_fails_the_launch(tmp_path):
    sup, _, db, clock = supervisor(tmp_path)
    sup.launcher = launcher = _PortRaceLauncher(fails=10)
    with pytest.raises(RuntimeError, match="Address already in use"):
        for _ in range(10):
            sup.step()
    assert launcher.ready_calls == 4  # the first try and three relaunches


def test_a_whole_checkpoints_cost_is_measured_inside_the_run_and_priced(tmp_path):
    """#55: a checkpoint costs training more than its blocking copy (its write and
    upload share the machine); a run that checkpointed every k >= 4 steps tells how
    much from its own step times (the p-th step after a checkpoint against the quiet
    half of the period), and the forecast prices a checkpoint with that."""
    from types import SimpleNamespace

    from jobctl.engine.calibration.startup import checkpoint_added_s, startup_for
    from jobctl.engine.planner.cost import Measured, cost_config
    from jobctl.engine.planner.resolver import machine_key

    k = 10  # 0.05 s steps; the two after each checkpoint 0.03 and 0.01 s slower
    slow = {1: 0.03, 2: 0.01}
    step_s = {s: 0.05 + slow.get((s - 1) % k + 1, 0.0) for s in range(1, 41)}
    assert checkpoint_added_s(step_s, k) == pytest.approx(0.04)
    assert checkpoint_added_s(step_s, 3) is None  # no quiet half to compare with
    assert checkpoint_added_s({s: t for s, t in step_s.items() if s <= 20}, k) is None
    sup, *_ = supervisor(tmp_path)
    sup.spec = sup.spec.model_copy(
        update={"checkpoint": sup.spec.checkpoint.model_copy(update={"interval": k})}
    )
    sup._record_checkpoint_costs(
        SimpleNamespace(snapshot_rates=[4e9], snapshot_sizes=[4e6], step_s=step_s)
    )
    key = machine_key(sup.spec)
    seen = startup_for(sup.db.home, key, "checkpoint")
    size = startup_for(sup.db.home, key, "checkpoint_bytes")
    assert (seen, size) == (pytest.approx(0.04), 4e6)
    measured = Measured(snapshot_gbytes_s=4.0, checkpoint_s=seen, checkpoint_bytes=size)
    # a rank copying 1.5 x the measured bytes: 1.5 x the measured cost
    assert cost_config(sup.spec, 9e6, measured, 6e6).snapshot_s == pytest.approx(0.06)
    # a model far larger than the measured one: its blocking copy at the measured rate
    assert cost_config(sup.spec, 6e9, measured, 3e9).snapshot_s == pytest.approx(1.5)
