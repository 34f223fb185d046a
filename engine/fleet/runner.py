"""Running a fleet: admit members into the shared pool, supervise them, survive a kill.

Each member runs as ``jobctl apply <member.yaml> --devices N`` in its own process and
session, so a member's crash is that member's failure only, and killing the runner
leaves its members running. Members are admitted in file order while their plan's
devices fit in the free part of the pool and fewer than ``max_concurrent`` run; a
member that does not fit yet does not hold back smaller ones behind it. All state is
in the ``fleets``/``fleet_members`` tables: ``fleet resume`` adopts members still
running from a killed runner, skips completed ones and re-applies the rest (which
continues each unfinished run from its newest checkpoint).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from jobctl.engine.core.process import pid_alive, process_token
from jobctl.engine.fleet.db import FleetDB
from jobctl.engine.recurring import procs
from jobctl.engine.state.db import StateDB
from jobctl.engine.state.leases import JobEvents


class FleetBusy(RuntimeError):
    """Another live runner drives this fleet."""


def admit(
    pending: list[tuple[str, int]], busy: int, running: int, pool: int, max_concurrent: int
) -> list[str]:
    """Names of the ``(name, devices)`` members to start now, in order."""
    chosen: list[str] = []
    for name, devices in pending:
        if running + len(chosen) >= max_concurrent:
            break
        if busy + devices <= pool:
            chosen.append(name)
            busy += devices
    return chosen


class FleetRunner:
    """Drives one recorded fleet until no member is pending or running."""

    def __init__(
        self,
        db: StateDB,
        name: str,
        *,
        spawn: procs.Spawn = procs.spawn_logged,
        clock: Callable[[], float] = time.time,
        wait: Callable[[float], object] = time.sleep,
        poll_s: float = 1.0,
        on_tick: Callable[[list[dict]], None] | None = None,
        stop: Callable[[procs.Child], None] = procs.stop_child,
    ) -> None:
        self.db, self.name = db, name
        self.fleets = FleetDB(db)
        self.spawn, self.clock, self.wait, self.stop = spawn, clock, wait, stop
        self.poll_s, self.on_tick = poll_s, on_tick
        self.owner = f"{procs.hostname()}:{os.getpid()}:{os.urandom(3).hex()}"
        self.events = JobEvents(db, "fleet", self.owner)
        self.dir = db.home / "fleets" / name
        self.children: dict[str, procs.Child] = {}
        self._stop = False

    def request_stop(self) -> None:
        """Stop the members and return at the next tick (safe from a signal handler)."""
        self._stop = True

    def run(self) -> str:
        """Run the fleet to its end; returns its final state."""
        self.start()
        state = "stopped"
        try:
            while self.step():
                self.wait(self.poll_s)
            state = self._final_state()
        finally:
            self.fleets.release_runner(self.name, self.owner, state, self.clock())
            self.record("end", f"fleet {state}")
        return state

    def start(self) -> None:
        """Become the fleet's runner; adopt live members, queue interrupted ones."""
        now = self.clock()
        row = self.fleets.get(self.name)
        if row is None:
            raise LookupError(f"no fleet {self.name!r}")
        if self.fleets.runner_alive(row, now):
            raise FleetBusy(f"fleet {self.name} is run by {row['runner_owner']}")
        mine = dict(runner_owner=self.owner, runner_host=procs.hostname(), runner_pid=os.getpid())
        mine["runner_token"] = process_token(os.getpid())
        if not self.fleets.claim_runner(self.name, row["runner_owner"], now, **mine):
            raise FleetBusy(f"fleet {self.name}: another runner claimed it first")
        self.record("start", f"runner {self.owner}")
        for m in self.fleets.members(self.name):
            self._take_over(m)

    def _take_over(self, m: dict) -> None:
        name = m["member"]
        if m["state"] == "completed":
            self.record("skip", f"{name}: completed earlier (run {m['run_id']})")
        elif m["state"] == "running" and pid_alive(m["pid"], m["pid_token"]):
            self.children[name] = procs.ForeignChild(m["pid"], m["pid_token"])
            self.record("adopt", f"{name}: pid {m['pid']} still running")
        elif m["state"] != "pending":
            self.fleets.update_member(self.name, name, state="pending")

    def step(self) -> bool:
        """One tick: reap, honour a stop, admit; True while members are left."""
        now = self.clock()
        self._reap(now)
        if self._stop or self.fleets.get(self.name)["state"] == "stopped":
            self._stop_all()
            return False
        self.fleets.update(self.name, now, heartbeat_at=now)
        members = self.fleets.members(self.name)
        self._admit(members, now)
        members = self.fleets.members(self.name)
        if self.on_tick is not None:
            self.on_tick(members)
        return any(m["state"] in ("pending", "running") for m in members)

    def _admit(self, members: list[dict], now: float) -> None:
        row = self.fleets.get(self.name)
        running = [m for m in members if m["member"] in self.children]
        pending = [(m["member"], m["devices"]) for m in members if m["state"] == "pending"]
        busy = sum(m["devices"] for m in running)
        by_name = {m["member"]: m for m in members}
        pool, limit = row["pool_devices"], row["max_concurrent"]
        for name in admit(pending, busy, len(running), pool, limit):
            self._launch(by_name[name], now)

    def _launch(self, m: dict, now: float) -> None:
        name = m["member"]
        spec_file = self.dir / f"{name}.yaml"
        spec_file.parent.mkdir(parents=True, exist_ok=True)
        spec_file.write_text(m["spec_yaml"])
        log = self.dir / "logs" / f"{name}.log"
        argv = procs.jobctl_argv(
            "apply", str(spec_file), "--home", str(self.db.home), "--devices", str(m["devices"])
        )
        child = self.spawn(argv, log)
        self.children[name] = child
        self.fleets.count_launch(
            self.name,
            name,
            pid=child.pid,
            pid_token=process_token(child.pid),
            log_path=str(log),
            started_at=now,
            ended_at=None,
            exit_code=None,
        )
        self.record("launch", f"{name}: pid {child.pid} on {m['devices']} device(s), log {log}")

    def _reap(self, now: float) -> None:
        for name, child in list(self.children.items()):
            code = child.poll()
            if code is None:
                continue
            del self.children[name]
            run = self.db.get_run(name)
            # An adopted member has no exit code (-1): its run's phase tells.
            ok = code == 0 or (code == -1 and run is not None and run["phase"] == "completed")
            state = "completed" if ok else "failed"
            self.fleets.update_member(
                self.name,
                name,
                only_if=("running",),  # a `fleet stop` that got there first wins
                state=state,
                ended_at=now,
                exit_code=None if code == -1 else code,
                run_id=run["id"] if run else None,
            )
            self.record("exit", f"{name}: {state}" + (f" (exit {code})" if code > 0 else ""))

    def _stop_all(self) -> None:
        for name, child in list(self.children.items()):
            self.stop(child)
            del self.children[name]
            self.fleets.update_member(
                self.name, name, only_if=("running",), state="stopped", ended_at=self.clock()
            )
            self.record("stop", f"{name}: stopped pid {child.pid}")

    def _final_state(self) -> str:
        states = {m["state"] for m in self.fleets.members(self.name)}
        if states <= {"completed"}:
            return "completed"
        return "stopped" if "stopped" in states else "failed"

    def record(self, kind: str, message: str) -> None:
        """A fleet event (``jobctl events FLEET``)."""
        self.events.add(self.name, kind, message, self.clock())
