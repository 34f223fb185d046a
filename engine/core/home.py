"""The state home: the folder that holds jobctl's state database, runs and caches.

It is ``JOBCTL_HOME`` (``engine.core.env.STATE_HOME``) or ``./.jobctl``; the state DB
(engine/state) keeps runs there, and the calibration and crossover caches live under
its ``calibration/``. A home that cannot be a folder (a file by its name) is one line
with the fix (``home_problem``), said by the state DB and by ``jobctl calibrate``
before it measures (#46 item 12).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from jobctl.engine.core.env import STATE_HOME


def default_home() -> Path:
    """``JOBCTL_HOME`` or ``./.jobctl``."""
    return Path(os.environ.get(STATE_HOME, ".jobctl")).resolve()


# A run id names a folder under the home's runs/: `<job name>-<date>-<time>-<hex>`; no
# '/', no leading '.', so `--run-id ../../x` cannot reach outside the state home.
RUN_ID_PATTERN = r"[a-z0-9][a-z0-9._-]{0,127}"


class HomeError(Exception):
    """The state home cannot be made a folder; the message is one line with the fix."""


def home_problem(home: Path, err: OSError) -> str:
    """Why ``home`` cannot be made a folder (a file by its name, no permission, a parent
    that is a file) and what to do, on one line."""
    if isinstance(err, FileExistsError) or (home.exists() and not home.is_dir()):
        why = "it is a file, not a folder"
    else:
        why = err.strerror or str(err)
    fix = f"point {STATE_HOME} (or --home) at a folder jobctl may create, or move {home} aside"
    return f"state home {home}: {why}; {fix}"


def make_home(home: Path | None = None) -> Path:
    """The state home (``home``, else the default), created if missing; HomeError when
    it cannot be (checked before work whose result is cached there)."""
    path = Path(home) if home else default_home()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HomeError(home_problem(path, e)) from None
    return path


def require_run_id(run_id: str) -> str:
    """``run_id`` if it is a safe folder name under runs/, else ValueError saying why."""
    if not re.fullmatch(RUN_ID_PATTERN, run_id):
        raise ValueError(
            f"{run_id!r} is not a run id: use lowercase letters, digits, '.', '_' and '-', "
            "starting with a letter or digit (at most 128 characters)"
        )
    return run_id
