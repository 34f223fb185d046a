"""Fleet members joined with their runs, for ``jobctl fleet status`` and its progress bars."""

from __future__ import annotations

from jobctl.engine.state.db import StateDB


def member_rows(db: StateDB, members: list[dict]) -> list[dict]:
    """Fleet members joined with their newest run (phase, step, loss, run id) as ``run``."""
    rows = []
    for m in members:
        run = db.get_run(m["run_id"] or m["member"]) if m["state"] != "pending" else None
        if run is not None and m["started_at"] and run["updated_at"] < m["started_at"] - 5:
            run = None  # an older run of the same name, not this launch
        rows.append({**m, "run": run})
    return rows
