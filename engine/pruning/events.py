"""The supervisor's side of pruning: phase changes and events from the workers' records.

A worker's ``pruning`` record (written by the reporter rank after every pruning step)
moves the run into the ``pruning`` phase; the profiling step that follows reports one
``profile`` record per rank; the first ``step`` record after the pruning step (the
profiled one) moves the run back to ``training``.
"""

from __future__ import annotations

from jobctl.engine.core.events import Kind
from jobctl.engine.state.db import StateDB


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def note(rec: dict) -> str:
    """One line describing a ``pruning`` record: the sparsity reached, per stage."""
    stages = ", ".join(_pct(s) for s in rec["stage_sparsity"])
    return (
        f"step {rec['step']}: {_pct(rec['achieved_sparsity'])} sparse "
        f"(target {_pct(rec['target_sparsity'])}); per stage {stages}"
    )


class PruningWatch:
    """Turns pruning/profile records into phases and events of one run."""

    def __init__(self, db: StateDB, run_id: str):
        self.db, self.run_id = db, run_id
        self.pruned_at: int | None = None

    def record(self, rec: dict) -> None:
        if rec["kind"] == Kind.PRUNING:
            self.db.set_phase(
                self.run_id, "pruning", f"step {rec['step']} to {_pct(rec['target_sparsity'])}"
            )
            self.db.add_event(self.run_id, "pruning", note(rec), rec)
            self.pruned_at = rec["step"]
        elif rec["kind"] == Kind.PROFILE and rec["replica"] == 0:
            blocks = rec["blocks"]
            total = sum(b["fwd_s"] + b["bwd_s"] for b in blocks.values())
            mem = rec["memory"]
            said = (
                f"step {rec['step']} stage {rec['stage']}: {len(blocks)} blocks, "
                f"fwd+bwd {1000 * total:.1f} ms, {mem['nonzero_params']} nonzero params, "
                f"peak RSS {mem['max_rss_mb']:.0f} MiB"
            )
            self.db.add_event(self.run_id, "profile", said, rec)

    def step(self, step: int) -> None:
        """A step finished: the profiled step after pruning ends the pruning phase."""
        if self.pruned_at is not None and step > self.pruned_at:
            self.pruned_at = None
            row = self.db.get_run(self.run_id)
            if row and row["phase"] == "pruning":
                self.db.set_phase(self.run_id, "training", f"profiled step {step}")
