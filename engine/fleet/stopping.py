"""``jobctl fleet stop``: stop a fleet so that ``fleet resume`` can continue it.

The fleet's state change reaches a runner on any host at its next tick; members on
this host are stopped here too, so a dead runner's orphans stop as well.
"""

from __future__ import annotations

import time

from jobctl.engine.fleet.db import FleetDB
from jobctl.engine.recurring.procs import hostname, pid_alive, stop_tree


def stop_fleet(fleets: FleetDB, row: dict) -> list[dict] | None:
    """Stop the fleet in ``row``: no more members start, running ones are stopped
    (resumable). None when it is complete (nothing to stop), else the members whose
    processes were stopped on this host."""
    if row["state"] == "completed":
        return None
    name = row["name"]
    fleets.update(name, time.time(), state="stopped")
    stopped = []
    for m in fleets.members(name):
        if m["state"] != "running":
            continue
        fleets.update_member(
            name, m["member"], only_if=("running",), state="stopped", ended_at=time.time()
        )
        here = row["runner_host"] in (None, hostname())  # member pids are the runner's host's
        if here and pid_alive(m["pid"], m["pid_token"]):
            stop_tree(m["pid"])
            stopped.append(m)
    return stopped
