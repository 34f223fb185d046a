"""Reading the state DB fast: the commands that only look (``status``, ``logs``,
``events``) read a SQLite state DB through the standard library's ``sqlite3``, without
importing SQLAlchemy (a tenth of a second of a command that must start in half a
second). Any other database URL, a DB file not created yet, or one an older jobctl
wrote (it lacks columns ``StateDB`` adds), is read through :class:`StateDB` as before.

Reads wait at most ``READ_WAIT_S`` for a lock: a DB in rollback-journal mode (not WAL,
e.g. on a file system without shared memory) that another process holds locked makes
a reader wait, and a reader says so and what to do rather than hang for the writers'
wait (``write_wait_s``: 10 s unless ``JOBCTL_DB_WRITE_WAIT_S`` says otherwise).
``StateDBError`` (one line naming the DB and the fix) lives here so that the command
line can catch it without importing SQLAlchemy.
"""

from __future__ import annotations

import math
import os
import re
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobctl.engine.core.env import DB_URL, DB_WRITE_WAIT, STATE_HOME
from jobctl.engine.core.home import default_home, home_problem

if TYPE_CHECKING:
    from jobctl.engine.state.db import StateDB

READ_WAIT_S = 2.0  # a reader's bound on waiting for another process's write lock
WRITE_WAIT_S = 10.0  # a writer's, unless JOBCTL_DB_WRITE_WAIT_S says otherwise

# The columns of ``runs`` this version reads (``engine.state.db.runs``; a unit test
# keeps the two equal). A DB lacking one is read through StateDB, which adds it.
RUN_COLUMNS = (
    "id",
    "name",
    "phase",
    "spec_path",
    "spec_hash",
    "run_dir",
    "created_at",
    "updated_at",
    "step",
    "total_steps",
    "loss",
    "samples_per_s",
    "devices",
    "plan",
    "last_checkpoint",
    "last_upload",
    "stragglers",
    "exit_code",
    "message",
    "pids",
    "backend",
    "supervisor_pid",
    "stop_requested",
    "recovery_s",
    "uploading_step",
    "supervisor_token",
)


class StateDBError(RuntimeError):
    """The state DB cannot be opened or read: the message names it and what to do."""


def write_wait_s() -> float:
    """How long a write waits for another process's lock: ``JOBCTL_DB_WRITE_WAIT_S``
    seconds (a finite number >= 0), else ``WRITE_WAIT_S``."""
    text = os.environ.get(DB_WRITE_WAIT, "").strip()
    if not text:
        return WRITE_WAIT_S
    try:
        wait = float(text)
    except ValueError:
        wait = math.nan
    if not (math.isfinite(wait) and 0 <= wait <= 86400):
        raise StateDBError(
            f"{DB_WRITE_WAIT}={text[:40]!r} is not a number of seconds: set it to one "
            f"between 0 and 86400, or unset it for the default {WRITE_WAIT_S:g} s"
        )
    return wait


_opened: list[str] = []  # URLs of the state DBs this process opened, newest last


def note_opened(url: str) -> None:
    """Remember that this process opened the state DB at ``url``: a write that gives up
    on a lock later (``write_error``) names that DB, not a guess from the environment."""
    _opened.append(url)


def _first_line(err: Exception) -> str:
    """The driver's own message of ``err`` (SQLAlchemy wraps it), first line only."""
    return str(getattr(err, "orig", None) or err).strip().splitlines()[0]


def _is_locked(text: str) -> bool:
    return "locked" in text or "busy" in text


def db_error(url: str, err: Exception, *, writing: bool = False) -> StateDBError:
    """What went wrong with the DB at ``url``, in one line, with what to do about it."""
    text = _first_line(err)
    if _is_locked(text):
        # A reader in WAL mode never waits for a writer, so a locked read means the DB
        # is in rollback-journal mode; a writer always waits for the other writer.
        why = f" (a write waited {write_wait_s():g} s)" if writing else ""
        mode = "" if writing else " (it is not in WAL mode, so readers wait for writers)"
        fix = (
            f"another process holds a write lock on it{mode}: retry when it is done, or "
            "stop that process (a long `jobctl` command or a program holding a "
            "transaction open)" + ("; nothing was changed" if writing else "")
        )
        text += why
    elif any(w in text for w in ("not a database", "malformed", "no such", "not jobctl's")):
        fix = (
            "it is damaged or not jobctl's: move it aside (jobctl starts an empty one) or "
            f"point {STATE_HOME} or {DB_URL} at another"
        )
    else:
        fix = f"check the file and its permissions, or point {STATE_HOME} or {DB_URL} elsewhere"
    return StateDBError(f"state DB {url}: {text}; {fix}")


def home_error(home: Path, err: OSError) -> StateDBError:
    """The state home cannot be made a folder (#46 item 12): a file by its name, no
    permission, a parent that is a file; one line with what to do."""
    return StateDBError(home_problem(home, err))


def url_error(url: str, err: Exception) -> StateDBError:
    """``JOBCTL_DB_URL`` names no database SQLAlchemy can open (#46 item 12): not a URL,
    an unknown dialect, or a driver that is not installed; one line with what to do."""
    shown = hide_password(url)
    unset = f"or unset {DB_URL} to use the state home's SQLite file"
    if isinstance(err, ImportError) and err.name:
        package = err.name.split(".")[0]
        return StateDBError(
            f"state DB {shown}: its driver {package!r} is not installed; "
            f"`pip install {package}`, {unset}"
        )
    return StateDBError(
        f"state DB {shown}: {DB_URL} is not a database URL ({_first_line(err)}); set it to "
        f"a SQLAlchemy URL such as postgresql+psycopg://user@host/jobctl, {unset}"
    )


def hide_password(url: str) -> str:
    """``url`` with the password of ``scheme://user:password@host`` as ``***``."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


def write_error(err: Exception) -> StateDBError | None:
    """One line for a write the DB refused: another process's lock held past the
    writers' 10 s busy wait, a read-only file, a damaged one (SQLAlchemy's
    OperationalError or DatabaseError); None for any other error (an IntegrityError is
    a bug of ours, not the environment's)."""
    if type(err).__name__ not in ("OperationalError", "DatabaseError"):
        return None
    url = _opened[-1] if _opened else os.environ.get(DB_URL) or str(default_home() / "state.db")
    return db_error(url, err, writing=True)


def _read_error(url: str, err: sqlite3.Error) -> StateDBError:
    """``db_error`` of a failed read, saying how long it waited for a lock."""
    text = str(err)
    if _is_locked(text):
        text = f"{text} (waited {READ_WAIT_S:g} s)"
    return db_error(url, RuntimeError(text))


def _python_type(declared: str) -> type | None:
    """The Python type of a column SQLite declared as ``declared`` (its affinity)."""
    d = declared.upper()
    if "INT" in d:
        return int
    if any(k in d for k in ("REAL", "FLOA", "DOUB")):
        return float
    if any(k in d for k in ("CHAR", "TEXT", "CLOB")):
        return str
    return None


def _clean(row: dict[str, Any], types: dict[str, type | None]) -> dict[str, Any]:
    """``row`` with every value of its column's type, as ``engine.state.db._clean``:
    a nonsense value (text in a number column) reads as None, not as a crash later."""
    for name, value in row.items():
        wanted = types.get(name)
        if value is None or wanted is None:
            continue
        if wanted is float and type(value) is int:
            row[name] = float(value)
        elif not isinstance(value, wanted) or (wanted is int and isinstance(value, bool)):
            row[name] = str(value) if wanted is str else None
    return row


class StateReader:
    """Read-only queries of a SQLite state DB: the read methods of ``StateDB``
    (``get_run``, ``list_runs``, ``events``) and ``timeline`` (``leases.timeline``)."""

    def __init__(self, home: Path, path: Path):
        self.home = home
        self.path = path
        self.url = f"sqlite:///{path}"
        self._types: dict[str, dict[str, type | None]] = {}
        try:
            self.conn = sqlite3.connect(path, timeout=READ_WAIT_S)
            self.conn.row_factory = sqlite3.Row
            for table in ("runs", "events", "job_events"):
                cols = self.conn.execute(f"PRAGMA table_info({table})").fetchall()
                self._types[table] = {c["name"]: _python_type(c["type"]) for c in cols}
        except sqlite3.Error as e:
            raise _read_error(self.url, e) from None

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    def current(self) -> bool:
        """Whether this DB has every table and column this version reads."""
        return bool(self._types["events"]) and set(RUN_COLUMNS) <= set(self._types["runs"])

    def _query(self, table: str, sql: str, args: tuple = ()) -> list[dict]:
        try:
            rows = self.conn.execute(sql, args).fetchall()
        except sqlite3.Error as e:
            raise _read_error(self.url, e) from None
        return [_clean(dict(r), self._types[table]) for r in rows]

    def get_run(self, ref: str) -> dict | None:
        """A run by id, or the newest run with that name."""
        rows = self._query("runs", "SELECT * FROM runs WHERE id = ?", (ref,)) or self._query(
            "runs", "SELECT * FROM runs WHERE name = ? ORDER BY created_at DESC LIMIT 1", (ref,)
        )
        return rows[0] if rows else None

    def list_runs(self) -> list[dict]:
        return self._query("runs", "SELECT * FROM runs ORDER BY created_at DESC")

    def events(self, run_id: str, limit: int | None = None) -> list[dict]:
        sql = "SELECT * FROM events WHERE run_id = ? ORDER BY id DESC"
        rows = self._query(
            "events", sql + (" LIMIT ?" if limit else ""), (run_id, limit) if limit else (run_id,)
        )
        return rows[::-1]

    def timeline(self, ref: str) -> list[dict]:
        """Every event of a job, oldest first, as ``engine.state.leases.timeline``."""
        found = self._query(
            "runs", "SELECT id, name FROM runs WHERE id = ? OR name = ?", (ref, ref)
        )
        ids = [r["id"] for r in found]
        names = sorted({r["name"] for r in found} | {ref})
        marks = ",".join("?" * len(ids))
        rows = [
            {**r, "source": r["run_id"]}
            for r in self._query(
                "events", f"SELECT * FROM events WHERE run_id IN ({marks})", tuple(ids)
            )
        ]
        if self._types["job_events"]:  # created by the first scheduler or fleet runner
            marks = ",".join("?" * len(names))
            rows += self._query(
                "job_events", f"SELECT * FROM job_events WHERE job IN ({marks})", tuple(names)
            )
        return sorted(rows, key=lambda r: r["ts"] or 0.0)


def read_state(home: Path | None = None) -> StateReader | StateDB:
    """The state DB of ``home`` to read from: a :class:`StateReader` for a current
    SQLite file, else a :class:`StateDB` (another URL, no file yet, an older schema)."""
    home = Path(home) if home else default_home()
    url = os.environ.get(DB_URL)
    path = _sqlite_path(url) if url else home / "state.db"
    if path is not None and path.is_file():
        reader = StateReader(home, path)
        if reader.current():
            return reader
        reader.conn.close()
    from jobctl.engine.state.db import StateDB

    return StateDB(home)


def _sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///FILE`` URL without query options; None for any other."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or "?" in url or url == prefix:
        return None
    return Path(url[len(prefix) :])


def timeline(db: StateReader | StateDB, ref: str) -> list[dict]:
    """Every event of a job, oldest first (``engine.state.leases.timeline``)."""
    if isinstance(db, StateReader):
        return db.timeline(ref)
    from jobctl.engine.state.leases import timeline as full

    return full(db, ref)
