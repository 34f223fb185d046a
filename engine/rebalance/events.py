"""The supervisor's side of rebalancing and packing: worker records into run events.

``rebalanced`` / ``packed`` / ``rebalance`` (nothing moved) and ``rebalance_measured``
records become events of the run with a one-line note; ``packed`` also names the freed
ranks and nodes, whose clean exit (and silence afterwards) the monitor must not take
for a failure or a lost machine.
"""

from __future__ import annotations

from jobctl.engine.core.events import Kind
from jobctl.engine.state.db import StateDB

KINDS = (Kind.REBALANCED, Kind.PACKED, Kind.REBALANCE, Kind.REBALANCE_MEASURED)


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def note(rec: dict) -> str:
    """One line describing a rebalancing record."""
    kind = rec["kind"]
    if kind == Kind.REBALANCE:
        return f"step {rec['step']}: layers stay ({rec['reason']})"
    if kind == Kind.REBALANCE_MEASURED:
        return (
            f"step {rec['step']}: measured stage imbalance "
            f"{_pct(rec['imbalance_measured_before'])} -> {_pct(rec['imbalance_measured_after'])}, "
            f"step {rec['step_s_before']:.3f} s -> {rec['step_s_after']:.3f} s"
        )
    moves = ", ".join(f"block {b}: {s}->{d}" for b, s, d in rec["moves"]) or "none"
    head = (
        f"step {rec['step']}: {rec['balancer']} by {rec['by']}, imbalance "
        f"{_pct(rec['imbalance_before'])} -> {_pct(rec['imbalance_after'])}, predicted step "
        f"{rec['predicted_step_s_before']:.3f} s -> {rec['predicted_step_s_after']:.3f} s; "
        f"moves {moves}"
    )
    if kind == Kind.PACKED:
        head += (
            f"; packed onto {rec['packed_to']} stages, freed rank(s) {rec['freed_ranks']}"
            f" node(s) {rec['freed_nodes']}"
        )
    return head


class RebalanceWatch:
    """Mirrors rebalancing records into a run's events; remembers freed nodes."""

    def __init__(self, db: StateDB, run_id: str):
        self.db, self.run_id = db, run_id
        self.freed_nodes: set[int] = set()

    def record(self, rec: dict) -> None:
        if rec["kind"] == Kind.PACKED:
            self.freed_nodes |= set(rec.get("freed_nodes", []))
        self.db.add_event(self.run_id, rec["kind"], note(rec), rec)
