"""The state home: the folder that holds jobctl's state database, runs and caches.

It is ``JOBCTL_HOME`` (``engine.core.env.STATE_HOME``) or ``./.jobctl``; the state DB
(engine/state) keeps runs there, and the calibration and crossover caches live under
its ``calibration/``.
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


def require_run_id(run_id: str) -> str:
    """``run_id`` if it is a safe folder name under runs/, else ValueError saying why."""
    if not re.fullmatch(RUN_ID_PATTERN, run_id):
        raise ValueError(
            f"{run_id!r} is not a run id: use lowercase letters, digits, '.', '_' and '-', "
            "starting with a letter or digit (at most 128 characters)"
        )
    return run_id
