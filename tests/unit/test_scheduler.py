"""Scheduled resumption in-process: leases, trigger decisions, the daemon loop, the book.

No training here: runs are rows in the state DB, children are fakes (or this test process),
and the clock is injected where time matters.
"""

from __future__ import annotations

import os
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.engine.recurring.book import NoSuchSchedule, ScheduleBook, cron_weekdays, trigger_for
from jobctl.engine.recurring.daemon import Daemon
from jobctl.engine.recurring.store import rule_json
from jobctl.engine.recurring.trigger import Trigger, fire
from jobctl.engine.state.db import StateDB
from jobctl.engine.state.leases import JobEvents, Leases
from jobctl.spec import ScheduleSpec, dump_yaml

from ..jobrun import tiny_spec

NO_SUCH_PID = 4_190_000  # above any pid this test machine hands out


class FakeChild:
    def __init__(self, pid: int) -> None:
        self.pid, self.code = pid, None

    def poll(self) -> int | None:
        return self.code


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def spawned():
    """A fake spawn that records argv and hands out fake children."""
    calls: list[tuple[list[str], Path]] = []

    def spawn(argv, log):
        calls.append((list(argv), log))
        return FakeChild(NO_SUCH_PID + len(calls))

    spawn.calls = calls
    return spawn


def _run(db: StateDB, run_id: str, name: str, *phases: str, pids: str | None = None) -> None:
    db.create_run(run_id, name, db.runs_dir / run_id, total_steps=5)
    for phase in phases:
        db.set_phase(run_id, phase)
    if pids is not None:
        db.update_run(run_id, pids=pids)


def _kinds(db: StateDB, job: str) -> list[str]:
    return [e["kind"] for e in JobEvents(db, "scheduler").list(job)]


# -- leases ------------------------------------------------------------------


def test_lease_claim_renew_release_expire(tmp_path):
    leases = Leases(StateDB(tmp_path))
    assert leases.claim("j", "a", "h", 1, now=100.0, ttl=10)
    assert not leases.claim("j", "b", "h", 2, now=105.0, ttl=10)  # live: a holds it
    assert leases.renew("j", "a", now=108.0, ttl=10)
    assert not leases.claim("j", "b", "h", 2, now=115.0, ttl=10)  # renewed until 118
    assert leases.claim("j", "b", "h", 2, now=118.5, ttl=10)  # expired: b takes it
    assert not leases.renew("j", "a", now=119.0, ttl=10)  # a lost it
    assert leases.release("j", "b", now=120.0)
    assert not leases.get("j").live(120.0)
    assert leases.claim("j", "a", "h", 1, now=120.0, ttl=10)  # released: free again


def test_only_one_of_many_racing_claimers_wins(tmp_path):
    db = StateDB(tmp_path)
    for round_ in range(5):
        job, winners, barrier = f"job-{round_}", [], threading.Barrier(8, timeout=30)

        def claim(i: int, job=job, winners=winners, barrier=barrier) -> None:
            leases = Leases(StateDB(tmp_path))  # own engine and connections, like a process
            barrier.wait()
            if leases.claim(job, f"owner-{i}", "h", i, now=100.0, ttl=30):
                winners.append(i)

        threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(winners) == 1, winners
        assert Leases(db).get(job).owner == f"owner-{winners[0]}"


# -- trigger decisions ---------------------------------------------------------


def test_trigger_resumes_a_stopped_run_and_holds_the_lease_until_exit(tmp_path, spawned):
    db, clock = StateDB(tmp_path), Clock()
    _run(db, "job-1", "job", "launching", "training", pids=str(NO_SUCH_PID))  # nodes dead
    trig = Trigger(db, ttl_s=30, clock=clock, spawn=spawned)
    assert trig.fire("job") == "launch"
    argv, log = spawned.calls[0]
    assert argv[-4:] == ["resume", "job-1", "--home", str(tmp_path)]
    assert log.parent == tmp_path / "scheduler" / "logs"
    lease = trig.leases.get("job")
    assert lease.owner == trig.owner and lease.child_pid == NO_SUCH_PID + 1
    assert trig.fire("job") == "skip"  # its own child still runs: nothing
    clock.t += 25
    trig.tick()  # renews
    assert trig.leases.get("job").expires_at == clock.t + 30
    trig.children["job"].code = 0
    trig.tick()
    assert not trig.children and not trig.leases.get("job").live(clock.t)
    assert _kinds(db, "job") == ["trigger", "launch", "trigger", "skip", "exit"]


def test_trigger_does_nothing_for_a_complete_job(tmp_path, spawned):
    db = StateDB(tmp_path)
    _run(db, "job-1", "job", "launching", "training", "completed")
    trig = Trigger(db, spawn=spawned)
    assert trig.fire("job") == "complete"
    assert not spawned.calls
    last = JobEvents(db, "scheduler").list("job")[-1]
    assert last["message"] == "run job-1 is complete (step 0/5); nothing to do"
    assert not trig.leases.get("job").live(trig.clock())  # released again


def test_trigger_does_nothing_while_the_nodes_of_a_run_are_alive(tmp_path, spawned):
    db = StateDB(tmp_path)
    _run(db, "job-1", "job", "launching", "training", pids=str(os.getpid()))  # alive
    trig = Trigger(db, spawn=spawned)
    assert trig.fire("job") == "skip"
    message = JobEvents(db, "scheduler").list("job")[-1]["message"]
    assert message == "running: run job-1 is training"
    db.update_run("job-1", pids=str(NO_SUCH_PID))  # the nodes die
    assert trig.fire("job") == "launch"


def test_a_live_lease_of_another_scheduler_means_running(tmp_path, spawned):
    db, clock = StateDB(tmp_path), Clock()
    _run(db, "job-1", "job", "launching", "training")
    Leases(db).claim("job", "other-daemon", "elsewhere", 1, now=clock.t, ttl=60)
    trig = Trigger(db, clock=clock, spawn=spawned)
    assert trig.fire("job") == "skip"
    clock.t += 61  # the other daemon died without releasing: the lease expires
    assert trig.fire("job") == "launch"
    assert len(spawned.calls) == 1


def test_an_orphaned_child_on_this_host_is_adopted_not_duplicated(tmp_path, spawned):
    db, clock = StateDB(tmp_path), Clock()
    _run(db, "job-1", "job", "launching", "training")
    orphan = FakeChild(os.getpid())  # a live process of this host stands in for the child
    dead = Trigger(db, clock=clock, spawn=lambda argv, log: orphan, stop=_never)
    assert dead.fire("job") == "launch"  # that daemon then dies: no more renewals
    clock.t += 120
    trig = Trigger(db, clock=clock, spawn=spawned, stop=_never)
    assert trig.fire("job") == "adopt"
    assert not spawned.calls and trig.children["job"].pid == orphan.pid
    trig.tick()
    assert trig.leases.get("job").owner == trig.owner  # renewed by the adopter
    trig.children["job"].token = "another-process"  # the pid now names something else
    trig.tick()
    assert not trig.children and _kinds(db, "job")[-1] == "exit"


def _never(child) -> None:
    raise AssertionError(f"stopped {child.pid}")


def test_a_lost_lease_stops_the_child(tmp_path, spawned):
    db, clock = StateDB(tmp_path), Clock()
    _run(db, "job-1", "job", "launching", "training")
    stopped = []
    trig = Trigger(db, ttl_s=10, clock=clock, spawn=spawned, stop=stopped.append)
    trig.fire("job")
    clock.t += 11  # this daemon stalled past its lease; another took it
    assert Leases(db).claim("job", "thief", "h", 9, now=clock.t, ttl=10)
    trig.tick()
    assert [c.pid for c in stopped] == [NO_SUCH_PID + 1] and not trig.children
    assert _kinds(db, "job")[-1] == "lease-lost"


def test_first_trigger_of_a_job_without_runs_applies_its_spec(tmp_path, spawned):
    trig = Trigger(StateDB(tmp_path), spawn=spawned)
    assert trig.fire("new", spec="/specs/new.yaml") == "launch"
    assert spawned.calls[0][0][-4:] == ["apply", "/specs/new.yaml", "--home", str(tmp_path)]
    assert trig.fire("ghost") == "error"  # neither a run nor a spec


def test_fire_needs_the_daemons_trigger():
    with pytest.raises(TypeError, match="scheduler run"):
        fire("job")


# -- rules --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cron", "aps"),
    [
        ("*", "*"),
        ("1-5", "mon,tue,wed,thu,fri"),
        ("0", "sun"),
        ("7", "sun"),
        ("5-7", "sun,fri,sat"),
        ("*/2", "sun,tue,thu,sat"),
        ("mon-fri", "mon,tue,wed,thu,fri"),
        ("6,0", "sun,sat"),
    ],
)
def test_cron_weekdays_follow_crontab_numbering(cron, aps):
    assert cron_weekdays(cron) == aps


def test_cron_rule_fires_on_crontab_weekdays_in_its_time_zone():
    rule = ScheduleSpec(cron="30 2 * * 1-5", timezone="Europe/Berlin")
    saturday = datetime(2026, 1, 3, 12, 0, tzinfo=timezone.utc)
    nxt = trigger_for(rule).get_next_fire_time(None, saturday)
    assert nxt.strftime("%a %H:%M") == "Mon 02:30" and nxt.utcoffset() == timedelta(hours=1)


def test_interval_rule_keeps_its_window():
    start = datetime(2030, 1, 1, tzinfo=timezone.utc)
    rule = ScheduleSpec(interval_s=90, start=start, end=start + timedelta(hours=1))
    trig = trigger_for(rule)
    assert trig.get_next_fire_time(None, datetime(2029, 6, 1, tzinfo=timezone.utc)) == start
    late = start + timedelta(hours=2)
    assert trig.get_next_fire_time(None, late) is None


# -- the daemon and the book ---------------------------------------------------------


def test_book_persists_schedules_across_restarts(tmp_path):
    db = StateDB(tmp_path)
    with ScheduleBook(db) as book:
        book.add("a", ScheduleSpec(interval_s=3600), "/a.yaml")
        book.add("b", ScheduleSpec(cron="0 */6 * * *", timezone="Europe/Berlin"), None, 60)
        book.pause("b")
    with ScheduleBook(StateDB(tmp_path)) as book:  # a new process, as far as the DB knows
        rows = {r.job: r for r in book.list()}
        assert rows["a"].rule == "every 3600 s (UTC)" and not rows["a"].paused
        assert rows["a"].spec == "/a.yaml"
        assert rows["b"].paused and rows["b"].grace_s == 60
        assert rows["b"].rule == "cron '0 */6 * * *' (Europe/Berlin)"
        book.resume("b")
        book.remove("a")
        with pytest.raises(NoSuchSchedule):
            book.pause("a")
    with ScheduleBook(StateDB(tmp_path)) as book:
        assert [(r.job, r.paused) for r in book.list()] == [("b", False)]
    kinds = [e["message"].split(":")[0] for e in JobEvents(db, "scheduler").list("b")]
    assert kinds == ["added", "paused", "resumed"]


def test_daemon_once_fires_due_schedules_and_waits_for_their_runs(tmp_path, spawned):
    db = StateDB(tmp_path)
    _run(db, "job-1", "job", "launching", "training")
    with ScheduleBook(db) as book:
        book.add("job", ScheduleSpec(interval_s=0.05), None)
        book.add("later", ScheduleSpec(interval_s=3600), None)
    ended = []

    def spawn(argv, log):
        child = spawned(argv, log)
        ended.append(child)
        return child

    trig = Trigger(db, spawn=spawn)
    daemon = Daemon(db, trig, poll_s=0.01)
    threading.Timer(0.3, lambda: setattr(ended[0], "code", 0)).start()
    threading.Event().wait(0.1)  # let the interval come due
    daemon.serve(once=True)  # returns once the child it started has exited
    assert _kinds(db, "job") == ["schedule", "trigger", "launch", "exit"]
    assert "trigger" not in _kinds(db, "later")


def test_daemon_records_a_missed_trigger_and_coalesces_a_backlog(tmp_path):
    db = StateDB(tmp_path)
    _run(db, "job-1", "job", "launching", "training")
    _run(db, "late-1", "late", "launching", "training")
    now = datetime.now(timezone.utc)
    rule = ScheduleSpec(interval_s=3600, start=now - timedelta(hours=5, minutes=1))
    hourly, stored = trigger_for(rule), rule_json(rule)  # the store keeps rules as data
    store = Daemon(db)
    store.start(paused=True)  # as `schedule add` does: nothing fires
    backlog = {"next_run_time": now - timedelta(hours=5), "misfire_grace_time": None}
    store.add_job(fire, hourly, id="job", kwargs={"job": "job", "rule": stored}, **backlog)
    late = {"next_run_time": now - timedelta(minutes=30), "misfire_grace_time": 60}
    store.add_job(fire, hourly, id="late", kwargs={"job": "late", "rule": stored}, **late)
    store.shutdown(wait=False)

    def exited(argv, log):
        child = FakeChild(NO_SUCH_PID)
        child.code = 0
        return child

    Daemon(db, Trigger(db, spawn=exited), poll_s=0.01).serve(once=True)  # the daemon was down
    assert _kinds(db, "job") == ["trigger", "launch", "exit"]  # 5 missed hours, 1 run
    assert _kinds(db, "late") == ["missed"]


def test_a_schedule_removed_while_it_fires_does_not_stop_the_daemon(tmp_path):
    db = StateDB(tmp_path)
    _run(db, "a-1", "a", "launching", "training")
    _run(db, "b-1", "b", "launching", "training")
    with ScheduleBook(db) as book:
        book.add("a", ScheduleSpec(interval_s=0.01), None)
        book.add("b", ScheduleSpec(interval_s=0.01), None)
    threading.Event().wait(0.05)

    def spawn_and_remove(argv, log):  # `schedule remove a` from another process, meanwhile
        if "a-1" in argv:
            with ScheduleBook(StateDB(tmp_path)) as other:
                other.remove("a")
        child = FakeChild(NO_SUCH_PID)
        child.code = 0
        return child

    Daemon(db, Trigger(db, spawn=spawn_and_remove), poll_s=0.01).serve(once=True)
    assert "launch" in _kinds(db, "b")  # the pass went on after the failed update of "a"
    with ScheduleBook(db) as book:
        assert [r.job for r in book.list()] == ["b"]


def test_schedule_cli_add_list_pause_remove(tmp_path):
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(dump_yaml(tiny_spec(**{"schedule.interval_s": 600})))
    runner = CliRunner()
    home = ["--home", str(tmp_path / "h")]
    r = runner.invoke(app, ["schedule", "add", str(spec_file), *home])
    assert r.exit_code == 0, r.output
    assert "scheduled quickstart: every 600 s (UTC)" in r.output
    r = runner.invoke(app, ["schedule", "add", "quickstart", "--cron", "0 3 * *", *home])
    assert r.exit_code == 2 and "--cron" in r.output and "5 fields" in r.output
    r = runner.invoke(app, ["schedule", "add", "nothing-here", "--every", "5", *home])
    assert r.exit_code == 2 and "neither a job spec file nor a job with" in r.output
    assert runner.invoke(app, ["schedule", "pause", "quickstart", *home]).exit_code == 0
    r = runner.invoke(app, ["schedule", "list", *home], env={"COLUMNS": "200"})
    assert "quickstart" in r.output and "paused" in r.output
    assert runner.invoke(app, ["schedule", "remove", "quickstart", *home]).exit_code == 0
    assert runner.invoke(app, ["schedule", "remove", "quickstart", *home]).exit_code == 2
    r = runner.invoke(app, ["events", "quickstart", *home], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and r.output.count("schedule") >= 3
