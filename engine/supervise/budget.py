"""The run's budget at run time (``budget`` in the spec), checked while an attempt trains.

* **Total cap** (``max_total_usd``): once the dollars so far plus one more step at the
  current rate and the devices' cost until the next check reach it, the run is asked
  to stop, as `jobctl stop` does (every rank checkpoints at the end of its step, then
  exits: nothing trained is lost); a ``budget`` event carries the figures. `jobctl
  resume` continues it (and stops again unless the budget was raised).
* **Hourly cap** (``max_hourly_usd``): devices running x price above it leaves a scale
  request (``scaling.ScaleRequest``) for the most devices the cap pays for; the monitor
  morphs the job onto them after a checkpoint, like `jobctl scale`; a ``budget`` event
  carries the figures.

The dollars are status's (``figures.run_figures``: device-seconds in training phases at
the price the run pays). Checked at most every ``CHECK_S`` seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.figures import run_figures
from jobctl.engine.supervise.run_requests import request_stop
from jobctl.engine.supervise.scaling import ScaleRequest, read_request, write_request
from jobctl.spec import JobSpec
from jobctl.spec.cost import run_price

CHECK_S = 1.0


class BudgetWatch:
    """Holds one run to ``spec.budget`` (module doc); ``check`` once per supervisor poll."""

    def __init__(
        self, db: StateDB, run_id: str, spec: JobSpec, clock: Callable[[], float] | None = None
    ) -> None:
        self.db, self.run_id, self.spec = db, run_id, spec
        self.clock = clock or db.clock
        self.checked_at = self.previous = -math.inf
        self.stopped = False
        self.shrunk_to: int | None = None

    def check(self) -> str | None:
        """``"stop"`` or ``"shrink"`` when this check acted on the budget, else None."""
        b = self.spec.budget
        now = self.clock()
        if not b.capped or self.stopped or now - self.checked_at < CHECK_S:
            return None
        self.previous, self.checked_at = self.checked_at, now
        row = self.db.get_run(self.run_id)
        if row is None or row["phase"] not in ("training", "checkpointing", "uploading"):
            return None
        if b.max_total_usd is not None and self._over_total(row, now, b.max_total_usd):
            return "stop"
        if b.max_hourly_usd is not None and self._over_hourly(row, b.max_hourly_usd):
            return "shrink"
        return None

    def _over_total(self, row: dict, now: float, cap: float) -> bool:
        f = run_figures(row, self.db.events(self.run_id), now)
        spent, next_step = f.cost_usd or 0.0, f.usd_per_step or 0.0
        # what the devices cost until the next check (as long as the last gap, on a busy
        # host more than CHECK_S), so that the stop comes before the cap, not after
        gap = max(CHECK_S, now - self.previous) if math.isfinite(self.previous) else CHECK_S
        until_next = (row.get("devices") or 0) * run_price(self.spec.hardware) * gap / 3600
        if spent + next_step + until_next < cap:
            return False
        self.stopped = True
        figures = {
            "usd": round(spent, 6),
            "usd_per_step": next_step,
            "usd_to_next_check": until_next,
            "max_total_usd": cap,
        }
        msg = (
            f"budget.max_total_usd ${cap:g} reached: ${spent:.4g} spent by step "
            f"{row['step'] or 0} (${next_step:.3g} a step): checkpoint, then stop"
        )
        self.db.add_event(self.run_id, "budget", msg, {**figures, "step": row["step"]})
        request_stop(self.db, row)  # as `jobctl stop`: the phase says stopping at once
        return True

    def _over_hourly(self, row: dict, cap: float) -> bool:
        price, devices = run_price(self.spec.hardware), row.get("devices") or 0
        hourly = devices * price
        target = int(cap // price) if price > 0 else devices
        if hourly <= cap or target < 1 or target == self.shrunk_to or not row.get("step"):
            return False  # (a morph is a checkpoint first: once a step is trained)
        run_dir = Path(row["run_dir"])
        if read_request(run_dir) is not None:  # a morph is already asked for
            return False
        self.shrunk_to = target
        msg = (
            f"budget.max_hourly_usd ${cap:g}: {devices} device(s) cost ${hourly:.4g}/h; "
            f"morphing to {target} device(s) (${target * price:.4g}/h)"
        )
        data = {"devices": devices, "target": target, "usd_per_hour": hourly}
        self.db.add_event(self.run_id, "budget", msg, {**data, "max_hourly_usd": cap})
        write_request(run_dir, ScaleRequest(target, "budget.max_hourly_usd", at_checkpoint=False))
        return True
