"""The state home: the folder that holds jobctl's state database, runs and caches.

It is ``JOBCTL_HOME`` (``engine.core.env.STATE_HOME``) or ``./.jobctl``; the state DB
(engine/state) keeps runs there, and the calibration and crossover caches live under
its ``calibration/``.
"""

from __future__ import annotations

import os
from pathlib import Path

from jobctl.engine.core.env import STATE_HOME


def default_home() -> Path:
    """``JOBCTL_HOME`` or ``./.jobctl``."""
    return Path(os.environ.get(STATE_HOME, ".jobctl")).resolve()
