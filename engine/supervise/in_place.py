"""The supervisor's steps that re-form a run's survivors in place (issue #25).

A part of ``Supervisor`` (engine/supervise/supervisor.py) kept in its own file: after
a lost node whose survivors handed their step over and wait (``Outcome.survivors_wait``),
``_reform_in_place`` re-plans for the devices left and posts the word
(engine/supervise/reform.py); each poll then goes to ``_await_reform`` until every
survivor has built its new trainer, and the same processes are watched as the next
attempt. Where they cannot re-form (the plan does not fit the surviving nodes, no
store, a survivor failed or did not answer in time) the survivors are ended and the
run is relaunched from the same emergency checkpoint, as before.
"""

from __future__ import annotations

import signal

from jobctl.engine.core.env import IN_PLACE
from jobctl.engine.supervise import reform
from jobctl.engine.supervise.scaling import next_attempt


class InPlaceSteps:
    """``Supervisor``'s in-place re-formation (see the module docstring)."""

    reforming: reform.Reformation | None  # the survivors' answers, while due

    def _in_place_env(self) -> dict[str, str]:
        """The workers' switch: wait for the word after a loss, where one can come."""
        return {IN_PLACE: "1"} if self.backend in reform.BACKENDS else {}

    def _watch_in_place(self, monitor) -> None:
        """A new monitor's part in re-forming: its epoch's keys and node scripts;
        survivors kept where their agents can be released at the end."""
        # The attempt's run host keeps it: 0 for fresh processes, one more for each
        # re-formation they made (an adopting supervisor learns it there too).
        monitor.epoch = reform.stored_epoch(monitor.run.dir)
        monitor.script_nodes = self.attempt.script_nodes
        monitor.keep_survivors = self.attempt.backend.name in reform.BACKENDS

    def _handing_over(self) -> bool:
        """Survivors handing a step over or re-forming: polled faster, they wait on it."""
        return self.reforming is not None or self.monitor.handover is not None

    def _stop_in_place(self) -> None:
        """A stop was asked: no survivors are kept for a re-formation, and survivors
        re-forming now are ended (the step they hold is on disk): the run stops between
        two attempts, and `jobctl resume` continues from that step."""
        if self.monitor is not None:
            self.monitor.keep_survivors = False
        if self.reforming is not None:
            self.reforming = None
            self.attempt.backend.cancel(self.attempt.handles, signal.SIGKILL)
            self._close_attempt()

    def _reform_in_place(self) -> str:
        """Re-plan for the survivors and re-form them, or relaunch where they cannot."""
        self._transition("planning", "re-planning for the devices left")
        out = self.outcome
        after = next_attempt(self.spec, self.plan, out, self.db, self.run_id, self.backend)
        point = self._resume_point() if after is not None else None
        started = None
        if point is not None and point.step == out.resume_step:
            started = reform.begin(
                self.spec,
                self.attempt,
                after,
                out.lost_nodes,
                point,
                self.monitor.epoch,
                self.clock,
            )
        if started is None:  # the relaunch: the survivors are ended first
            self.attempt.backend.cancel(self.attempt.handles, signal.SIGKILL)
            self._close_attempt()
            if after is None:
                return self._finish(out)
            self.plan = after
            return self._note_plan()
        if self.progress is not None:  # the next attempt's bar comes with its monitor
            self.progress.stop()
        self.plan, (self.attempt, self.reforming) = after, started
        self.current, self.monitor = self.attempt.run, None
        self.db.update_run(self.run_id, pids=",".join(map(str, self.attempt.handles)))
        self._note_plan()
        # Live processes are joining: as a launch, for `jobctl stop` and an adoption.
        self._transition("launching", f"{self.plan.summary()} (re-forming in place)")
        return self.phase

    def _await_reform(self) -> str:
        """The survivors' answers; once all built their trainers, train on (a failure:
        relaunch from the same checkpoint, the survivors ended first)."""
        why = self.reforming.settled()
        ended = [s.detail for s in self.attempt.backend.status(self.attempt.handles) if s.done]
        if why is None and ended:  # a survivor's node gave up (or was ended) meanwhile
            why = f"a surviving node ended ({', '.join(ended)})"
        if why is None:
            return self._refresh()
        done, self.reforming = self.reforming, None
        step = done.step
        if why:
            self.db.add_event(self.run_id, "reform", f"re-forming in place failed: {why}")
            self.attempt.backend.cancel(self.attempt.handles, signal.SIGKILL)
            self._close_attempt()
            return self._launch()  # from the same checkpoint
        n = len(self.attempt.handles)
        handed = (self.outcome.handover or {}).get("step")  # else the notice's checkpoint
        source = "emergency checkpoint" if handed == step else "checkpoint"
        said = f"from step {step} ({source}, in place) as {self.plan.summary()}"
        data = {"step": step, "source": source, "in_place": True, "epoch": done.epoch + 1}
        self.db.add_event(self.run_id, "resume", said, data)
        if self.loss is not None:
            self.loss = self.loss.resumed_at(step, handed)
        self._transition("training", f"re-formed in place on {n} node(s)")
        self._watch()
        self.monitor.offset = done.offset  # its first records may predate the watch
        return self.phase
