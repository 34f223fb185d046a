"""A broken environment is one line with a fix, exit 2, never a traceback (#46 item 12).

Before, ``JOBCTL_HOME`` set to a regular file gave ``FileExistsError`` from every
command that opens the state DB, ``JOBCTL_DB_URL=nonsense://::`` gave SQLAlchemy's
``ValueError``, and a postgres URL without its driver ``ModuleNotFoundError: psycopg``.
Now ``StateDB`` turns each into a ``StateDBError`` naming the home or the URL (its
password hidden) and what to do, which the command line prints as one line.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobctl.engine.core.env import DB_URL, STATE_HOME
from jobctl.engine.state.db import StateDB, StateDBError
from jobctl.engine.state.reader import hide_password

ROOT = Path(__file__).resolve().parents[2]
NO_PSYCOPG = importlib.util.find_spec("psycopg") is None
PG = "postgresql+psycopg://jobctl:s3cret@localhost/jobctl"


def _jobctl(tmp_path: Path, env: dict[str, str], *argv: str) -> str:
    full = {**os.environ, "PYTHONPATH": str(ROOT.parent), **env}
    cmd = [sys.executable, "-m", "jobctl.engine.cli.app", *argv]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=full, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    return done.stderr


@pytest.mark.parametrize("argv", [["status"], ["events", "x"], ["schedule", "list"]])
def test_a_home_that_is_a_file_is_one_line(tmp_path, argv):
    home = tmp_path / "home"
    home.write_text("not a folder\n")
    out = _jobctl(tmp_path, {STATE_HOME: str(home)}, *argv)
    assert f"state home {home}: it is a file, not a folder" in out and STATE_HOME in out


@pytest.mark.parametrize("argv", [["status"], ["logs", "x"]])
def test_a_db_url_that_is_not_a_url_is_one_line(tmp_path, argv):
    out = _jobctl(tmp_path, {DB_URL: "nonsense://::"}, *argv)
    assert "nonsense://::" in out and "is not a database URL" in out and f"unset {DB_URL}" in out


@pytest.mark.skipif(not NO_PSYCOPG, reason="psycopg is installed here")
def test_a_db_url_whose_driver_is_missing_is_one_line_without_the_password(tmp_path):
    out = _jobctl(tmp_path, {DB_URL: PG}, "status")
    assert "driver 'psycopg' is not installed" in out and "pip install psycopg" in out
    assert "s3cret" not in out and "jobctl:***@localhost" in out


def test_state_db_raises_state_db_error_for_each(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(StateDBError, match="it is a file, not a folder"):
        StateDB(tmp_path / "file")
    with pytest.raises(StateDBError, match="is not a database URL"):
        StateDB(tmp_path / "home", url="nonsense://::")
    with pytest.raises(StateDBError, match="is not a database URL"):
        StateDB(tmp_path / "home", url="nosuchdialect://x")
    if NO_PSYCOPG:
        with pytest.raises(StateDBError, match="driver 'psycopg'"):
            StateDB(tmp_path / "home", url=PG)


def test_hide_password():
    assert hide_password(PG) == "postgresql+psycopg://jobctl:***@localhost/jobctl"
    assert hide_password("sqlite:////a/b.db") == "sqlite:////a/b.db"


def test_apply_on_a_damaged_db_says_so_before_planning(tmp_path):
    """#46 item 9: `apply` on a damaged state DB planned and printed 21 lines before it
    said the DB was damaged; it opens the DB first now, as `status` does."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "state.db").write_text("not a database, whatever it is\n")
    full = {**os.environ, "PYTHONPATH": str(ROOT.parent), STATE_HOME: str(home)}
    full.pop(DB_URL, None)
    quickstart = str(ROOT / "jobs" / "quickstart.yaml")
    cmd = [sys.executable, "-m", "jobctl.engine.cli.app", "apply", quickstart]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=full, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "is damaged or not jobctl's" in done.stderr and done.stderr.count("\n") == 1
    assert done.stdout == ""  # no plan, nothing launched


@pytest.mark.parametrize("table", ["runs", "events"])
def test_a_foreign_table_by_our_name_is_refused_and_left_as_it_was(tmp_path, table):
    """#46 item 12: another program's ``runs`` table was given jobctl's columns and
    written to. Now the DB is refused in one line naming the table, and not touched."""
    import sqlite3

    home = tmp_path / "home"
    home.mkdir()
    con = sqlite3.connect(home / "state.db")
    con.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, invoice TEXT)")
    con.execute(f"INSERT INTO {table} (invoice) VALUES ('INV-1')")
    con.commit()
    before = con.execute(f"SELECT sql FROM sqlite_master WHERE name = '{table}'").fetchone()
    con.close()
    with pytest.raises(StateDBError, match=f"table {table} is not jobctl's"):
        StateDB(home)
    out = _jobctl(tmp_path, {STATE_HOME: str(home)}, "status")
    assert f"table {table} is not jobctl's" in out and "move it aside" in out
    con = sqlite3.connect(home / "state.db")
    after = con.execute(f"SELECT sql FROM sqlite_master WHERE name = '{table}'").fetchone()
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    rows = con.execute(f"SELECT invoice FROM {table}").fetchall()
    con.close()
    assert after == before and rows == [("INV-1",)] and names == {table}


def test_a_detached_apply_on_a_db_that_refuses_writes_says_so_in_one_line(tmp_path):
    """#46 item 12: `apply --detach` on a read-only DB wrote SQLAlchemy's raw error into
    the supervisor log and said "the run is marked failed; traceback in None" though no
    run row existed. Now the background apply exits 2 with the DB's one line, and the
    foreground command repeats it; nothing is recorded."""
    home = tmp_path / "home"
    StateDB(home)  # a jobctl DB, then opened read-only (root ignores file modes)
    url = f"sqlite:///file:{home / 'state.db'}?mode=ro&uri=true"
    full = {**os.environ, "PYTHONPATH": str(ROOT.parent), STATE_HOME: str(home), DB_URL: url}
    quickstart = str(ROOT / "jobs" / "quickstart.yaml")
    cmd = [sys.executable, "-m", "jobctl.engine.cli.app", "apply", quickstart, "--detach"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=full, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "the background apply ended (2): state DB" in done.stderr, done.stderr
    assert "readonly database" in done.stderr and "permissions" in done.stderr
    (log,) = (home / "supervisors").iterdir()
    text = log.read_text()
    assert "Traceback" not in text and "traceback in None" not in text and "[SQL:" not in text
    assert text.strip().splitlines()[-1].startswith("error: state DB ")
    assert StateDB(home).list_runs() == []
