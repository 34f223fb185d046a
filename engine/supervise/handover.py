"""The supervisor's side of a lost node: the survivors hand their step over first.

When the monitor finds nodes lost (a process tree gone, heartbeats stopped, a worker
killed), it kills what is left of those nodes and, where every pipeline stage still
has a live replica on the other nodes, does not tear the attempt down at once: it
tells the survivors which nodes are lost (its word, in the run host's store, which
engine/worker/survival.py waits for), and waits until every survivor says it wrote its
part of the emergency checkpoint (or why it could not), for at most ``WAIT_S``. Then
the rest is torn down and the run morphs: the resume finds the emergency checkpoint as
the newest complete one. With a stage left without a replica there is nothing to hand
over: the attempt ends at once and the run falls back to its newest checkpoint.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import timedelta

from jobctl.engine.channel.host import read_host
from jobctl.engine.checkpoint.emergency import survivors_of, uncovered_stages
from jobctl.engine.state.db import StateDB

KEY = "jobctl/emergency/"  # engine/worker/survival.py's, then the epoch
# Beyond a survivor's own bounds (engine/worker/survival.py: its peers' records, 60 s),
# so a slow peer ends in an answer rather than in the supervisor giving up first.
WAIT_S = float(os.environ.get("JOBCTL_HANDOVER_WAIT_S", "100"))


class Handover:
    """One lost-node handover: the word to the survivors, then their answers."""

    def __init__(
        self, run, lost: list[int], gone: set[int], clock: Callable[[], float], epoch: int = 0
    ):
        self.run, self.lost, self.clock = run, sorted(lost), clock
        self.key = f"{KEY}{epoch}/"  # this loss's keys (an epoch per re-formation in place)
        plan = run.plan
        self.survivors = survivors_of(plan, self.lost, gone)
        self.missing = uncovered_stages(plan, self.survivors)
        self.deadline = clock() + WAIT_S
        self.answers: dict[int, dict] = {}
        self.store = connect_store(run.dir)
        if self.store is not None:  # survivors waiting for it learn at once either way
            word = {"nodes": self.lost, "gone": sorted(gone)}
            self.store.set(f"{self.key}lost", json.dumps(word))

    @property
    def possible(self) -> bool:
        """Can the survivors hand a step over (a store to talk through, every stage)?"""
        return self.store is not None and not self.missing and bool(self.survivors)

    def settled(self) -> bool:
        """Every survivor answered, or the bound passed."""
        if not self.possible:
            return True
        for r in self.survivors:
            key = f"{self.key}done/{r}"
            if r not in self.answers and self.store.check([key]):
                self.answers[r] = json.loads(self.store.get(key))
        return len(self.answers) == len(self.survivors) or self.clock() > self.deadline

    def result(self) -> dict:
        """``{"step": the handed-over step or None, "why": ...}``."""
        if self.store is None:
            return {"step": None, "why": "no run host store to hand a step over through"}
        if self.missing:
            return {"step": None, "why": f"no live replica of stage(s) {self.missing}"}
        steps = {a["step"] for a in self.answers.values()}
        if len(self.answers) < len(self.survivors):
            late = sorted(set(self.survivors) - set(self.answers))
            return {"step": None, "why": f"rank(s) {late} did not answer in {WAIT_S:.0f} s"}
        if len(steps) != 1 or None in steps:
            whys = sorted({a.get("why") or "" for a in self.answers.values()} - {""})
            return {"step": None, "why": "; ".join(whys) or f"survivors disagree: {steps}"}
        return {"step": steps.pop(), "why": ""}

    def record(self, db: StateDB) -> dict:
        """The ``emergency`` event: which happened, handover or fallback."""
        got = self.result()
        if got["step"] is not None:
            note = (
                f"emergency checkpoint of step {got['step']} written by the survivors "
                f"(ranks {self.survivors}) of node(s) {self.lost}"
            )
        else:
            note = f"no emergency checkpoint ({got['why']}): the newest checkpoint is used"
        db.add_event(self.run.id, "emergency", note, {**got, "survivors": self.survivors})
        return got


def connect_store(run_dir):
    """A client of the attempt's run host store, or None (no run host)."""
    host = read_host(run_dir)
    endpoint = getattr(host, "rdzv_endpoint", None) if host is not None else None
    if not endpoint:
        return None
    from torch.distributed import TCPStore

    name, port = endpoint.rsplit(":", 1)
    try:
        return TCPStore(name, int(port), is_master=False, timeout=timedelta(seconds=5))
    except (RuntimeError, OSError):
        return None
