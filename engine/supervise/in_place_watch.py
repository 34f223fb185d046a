"""The monitor's part in re-forming survivors in place (issue #25).

A part of ``Monitor`` (engine/supervise/monitor.py) kept in its own file. After a
re-formation (engine/supervise/reform.py) the same processes are a new attempt:

* its records are the epoch's: a sender's id ends in its epoch (``rank-R-PID-E``,
  engine/channel/client.py), and what the old trainers said on their way out is the
  previous attempt's, read by its monitor;
* node k of the new plan still runs under the node script it was launched with, whose
  own records (``node_sigterm``) carry that script's number: ``script_nodes`` maps it;
* at the end its agents are released from torchrun's exit barrier, which would wait
  for the lost node's agent (300 s);
* a partial preemption notice (some nodes, not all, told to stop) keeps the others, once
  every rank checkpointed, to re-form rather than be relaunched.
"""

from __future__ import annotations

from jobctl.backends import NodeStatus
from jobctl.engine.core.events import Kind


class InPlaceWatch:
    """``Monitor``'s re-formation part (see the module docstring)."""

    def _init_in_place(self) -> None:
        self.keep_survivors = False  # kept after a hand-over or a partial notice
        self.epoch = 0  # the attempt's processes' re-formations so far
        self.script_nodes: list[int] | None = None  # node k's script (None: k's own)

    def _this_epoch(self, recs: list[dict]) -> list[dict]:
        """The records of this attempt (see the module docstring), node scripts' in the
        plan's node numbers."""
        out = []
        scripts = {s: k for k, s in enumerate(self.script_nodes or [])}
        for rec in recs:
            src = rec.get("src")
            if isinstance(src, str) and src.startswith("rank-"):
                epoch = src.rsplit("-", 1)[-1]
                if epoch.isdigit() and int(epoch) < self.epoch:
                    continue
            if scripts and rec.get("kind") == Kind.NODE_SIGTERM:
                if rec.get("node") not in scripts:
                    continue  # a lost node's script, ending
                rec = {**rec, "node": scripts[rec["node"]]}
            out.append(rec)
        return out

    def _release_at_end(self) -> None:
        """After a re-formation, every node not yet released, once every step trained
        (a release marks its nodes released, tried or not: once)."""
        if self.epoch == 0 or not self.records.finished:
            return
        left = [n for n in range(len(self.handles)) if n not in self.released]
        if left:
            self._release(left, "every step trained")

    def _noticed_some(self, statuses: list[NodeStatus]) -> bool:
        """Some nodes, not all, were told to stop (preemption notices) and every rank
        checkpointed: the others stay, to re-form in place (engine/supervise/reform.py)."""
        r, nodes = self.records, set(range(len(statuses)))
        elastic = getattr(self.run.ctx.elasticity, "enabled", False)  # else no morph at all
        if not (self.keep_survivors and elastic) or self.scale_to is not None or r.freed_ranks:
            return False
        if len(self.handles) != self.run.ctx.nnodes or not r.sigterm_nodes:
            return False
        everyone = len(r.stopped_ranks) >= self.run.plan.world_size
        return everyone and not r.sigterm_nodes >= nodes and r.stopped_step is not None

    def _survivors_of_notice(self, statuses: list[NodeStatus]):
        """The noticed nodes ended, the others kept waiting. Every rank's ``stopped``
        came after its checkpoint part (and upload grace): what is left of the noticed
        nodes is their agents' shutdown, which the re-formation need not wait for."""
        r = self.records
        lost = sorted(r.sigterm_nodes)
        self.backend.cancel([self.handles[n] for n in lost if not statuses[n].done], 9)
        out = self._conclude("preempted", 0, f"node(s) {lost} preempted after a checkpoint", lost)
        out.survivors_wait, out.resume_step = True, r.stopped_step
        return out
