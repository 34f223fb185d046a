"""Hostile command-line input (#24 items 16, 18, 19): a run id that leaves the state
home, rich markup in user strings, a damaged or locked state DB.
"""

from __future__ import annotations

import logging
import os
import pickle
import sqlite3
import subprocess
import time

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.engine.core.home import require_run_id
from jobctl.engine.fleet.loader import load_fleet
from jobctl.engine.recurring.book import ScheduleBook
from jobctl.engine.recurring.store import TABLE
from jobctl.engine.state.db import StateDB, StateDBError
from jobctl.spec import ScheduleSpec, SpecError

from ..jobrun import QUICKSTART

runner = CliRunner()


@pytest.mark.parametrize("run_id", ["../../x", "a/b", ".hidden", "", "x\ny", "A" * 200])
def test_a_run_id_that_leaves_the_state_home_is_refused(tmp_path, monkeypatch, run_id):
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    result = runner.invoke(app, ["apply", str(QUICKSTART), "--home", str(home), "--run-id", run_id])
    assert result.exit_code == 2 and "is not a run id" in result.output
    assert not (tmp_path / "x").exists() and not home.exists()
    with pytest.raises(ValueError, match="is not a run id"):
        require_run_id(run_id)


def test_run_ids_jobctl_makes_pass():
    assert require_run_id("quickstart-20261125-231500-0a1b") == "quickstart-20261125-231500-0a1b"


class Planted:
    """A pickle that, once loaded, touches ``path``: what a planted job-store row did."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_schedule_rows_are_data_a_planted_pickle_runs_nothing(tmp_path, caplog):
    db = StateDB(tmp_path / "home")
    rule = ScheduleSpec(cron="0 * * * *")
    with ScheduleBook(db) as book:
        book.add("good", rule, None)
    marker = tmp_path / "pwned"
    planted = pickle.dumps(Planted(marker), protocol=0).decode()
    with db.engine.begin() as conn:
        conn.execute(
            sa.text(f"INSERT INTO {TABLE} VALUES ('evil', 1.0, :state)"), {"state": planted}
        )
        conn.execute(
            sa.text("CREATE TABLE apscheduler_jobs (id TEXT, next_run_time REAL, job_state BLOB)")
        )
        conn.execute(
            sa.text("INSERT INTO apscheduler_jobs VALUES ('evil', 1.0, :s)"),
            {"s": planted.encode()},
        )
    with caplog.at_level(logging.WARNING, logger="jobctl.engine.recurring.store"):
        result = runner.invoke(app, ["schedule", "list", "--home", str(tmp_path / "home")])
    assert result.exit_code == 0, result.output
    assert any("1 schedule(s) of an older jobctl" in r.getMessage() for r in caplog.records)
    assert "good" in result.output and "evil" not in result.output
    assert not marker.exists()
    with ScheduleBook(db) as book:
        assert [row.job for row in book.list()] == ["good"]
        assert book.get("good").rule == "cron '0 * * * *' (UTC)"


@pytest.mark.parametrize("where", ["member_name", "template"])
def test_a_fleet_template_cannot_reach_python(tmp_path, where):
    marker = tmp_path / "pwned"
    evil = "{{ cycler.__init__.__globals__.os.system('touch " + str(marker) + "') }}"
    name, template = (
        "m-{{ lr }}",
        "name: x\\nmodel: {}\\ntraining: {global_batch_size: 4, steps: 1}",
    )
    if where == "member_name":
        name += evil
    else:
        template += "\\n# " + evil
    path = tmp_path / "fleet.yaml"
    path.write_text(
        f'name: f\nmatrix: {{lr: [0.1]}}\nmember_name: "{name}"\ntemplate: "{template}\\n"\n'
    )
    with pytest.raises(SpecError) as info:
        load_fleet(path)
    assert not marker.exists()
    assert any("is unsafe" in issue.message for issue in info.value.errors), info.value


def test_a_damaged_state_db_is_one_line_naming_it_and_the_fix(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "state.db").write_bytes(b"not a database at all " * 100)
    with pytest.raises(StateDBError, match="file is not a database; it is damaged"):
        StateDB(home)
    env = {**os.environ, "JOBCTL_HOME": str(home)}
    done = subprocess.run(["jobctl", "status"], env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert str(home / "state.db") in line and "move it aside" in line


@pytest.mark.parametrize("table", ["runs", "events"])
def test_a_renamed_table_is_one_line_not_an_empty_db(tmp_path, table):
    """Creating the missing table afresh would show no runs with no word (#24 item 16)."""
    db = StateDB(tmp_path / "home")
    db.create_run("r-1", "r", tmp_path / "r", total_steps=4)
    db.engine.dispose()
    con = sqlite3.connect(tmp_path / "home" / "state.db")
    con.execute(f"ALTER TABLE {table} RENAME TO {table}_old")
    con.commit()
    con.close()
    with pytest.raises(StateDBError, match=f"no such table: {table}.*move it aside"):
        StateDB(tmp_path / "home")
    con = sqlite3.connect(tmp_path / "home" / "state.db")
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert table not in names  # nothing was created behind the user's back


def test_status_reads_while_another_process_holds_a_write_lock(tmp_path):
    db = StateDB(tmp_path / "home")
    db.create_run("r-1", "r", tmp_path / "r", total_steps=4)
    holder = sqlite3.connect(tmp_path / "home" / "state.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("UPDATE runs SET step = 3")
    try:
        start = time.monotonic()
        assert [row["step"] for row in StateDB(tmp_path / "home").list_runs()] == [0]
        assert time.monotonic() - start < 5.0
    finally:
        holder.execute("ROLLBACK")


def test_nonsense_rows_read_as_none_and_status_prints(tmp_path):
    db = StateDB(tmp_path / "home")
    db.create_run("r-1", "r", tmp_path / "r", total_steps=4)
    with db.engine.begin() as conn:
        conn.execute(sa.text("UPDATE runs SET step = 'abc', loss = 'x', total_steps = '[/x]'"))
    row = db.get_run("r-1")
    assert (row["step"], row["loss"], row["total_steps"]) == (None, None, None)
    result = runner.invoke(app, ["status", "--home", str(tmp_path / "home")])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "[/x]"],
        ["logs", "[/x]"],
        ["report", "[/x]"],
        ["schedule", "pause", "[/x]"],
    ],
)
def test_rich_markup_in_user_strings_is_printed_not_parsed(tmp_path, argv):
    result = runner.invoke(app, [*argv, "--home", str(tmp_path / "home")])
    assert result.exit_code == 2, result.output
    assert "[/x]" in result.output and "MarkupError" not in repr(result.exception)


def test_markup_in_a_run_message_is_printed_not_parsed(tmp_path):
    db = StateDB(tmp_path / "home")
    db.create_run("r-1", "r", tmp_path / "r", total_steps=4)
    db.add_event("r-1", "upload_error", "[/x] [bold]not bold")
    db.update_run("r-1", message="[/y]", plan="[/z]", stragglers="[/s]")
    result = runner.invoke(app, ["status", "r-1", "--home", str(tmp_path / "home")])
    assert result.exit_code == 0, result.output
    assert "[/x] [bold]not bold" in result.output


def test_markup_in_a_spec_path_is_printed_not_parsed(tmp_path):
    path = tmp_path / "[red]job.yaml"
    path.write_text("name: [\n")
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2 and "[red]job.yaml" in result.output


def test_status_reads_a_rollback_journal_db_while_another_process_writes(tmp_path):
    db = StateDB(tmp_path / "home")
    db.create_run("r-1", "r", tmp_path / "r", total_steps=4)
    db.engine.dispose()
    holder = sqlite3.connect(tmp_path / "home" / "state.db", isolation_level=None)
    holder.execute("PRAGMA journal_mode=DELETE")  # as an older tool may have left it
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("UPDATE runs SET step = 3")
    try:
        result = runner.invoke(app, ["status", "--home", str(tmp_path / "home")])
        assert result.exit_code == 0 and "r-1" in result.output, result.output
    finally:
        holder.execute("ROLLBACK")


@pytest.mark.parametrize("value", ["1e-300", "1e-7"])
def test_a_device_memory_no_model_fits_is_a_located_validate_error(tmp_path, value):
    """#46 item 9: ``memory_gb: 1e-300`` reached the planner, which said "stage 0 needs
    0.00 GB > 1e-300 GB" with no file:line; validate now refuses it at its line."""
    text = QUICKSTART.read_text()
    lines = text.splitlines()
    (index,) = [i for i, line in enumerate(lines) if line.startswith("  memory_gb:")]
    lines[index] = f"  memory_gb: {value}"
    job = tmp_path / "job.yaml"
    job.write_text("\n".join(lines) + "\n")
    r = CliRunner().invoke(app, ["validate", str(job)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert f"{job}:{index + 1}:14: hardware.memory_gb:" in r.output and "0.000001" in r.output


def test_a_tiny_stage_is_priced_in_figures_not_zero():
    from jobctl.engine.planner.sizing import GB, gb_text

    got = (gb_text(33.63 * GB), gb_text(0.0021 * GB), gb_text(2e-6 * GB))
    assert got == ("33.63", "0.0021", "2e-06")
